"""GPU serving replicas above what demand and the forecast need are lent to finite GPU jobs
short of GPUs, no lower than what the forecast's median needs before they are done (issue 26:
"GPU jobs must never wait behind headroom nobody uses")."""

from __future__ import annotations

from tideshift.services.planner.core import (
    ClusterView,
    NodeSpec,
    PlanInputs,
    Target,
    TrainingJob,
)
from tideshift.services.planner.core.lending.gpu_loan import gpu_jobs_short, lend, lend_gpu_room
from tideshift.services.planner.core.model import (
    Forecast,
    HeadroomParts,
    ServingWorkload,
    TargetDecision,
)
from tideshift.services.planner.core.serving import ServingPlan

GIB = 2**30
NOW = 10_000.0
INFER = ServingWorkload(
    Target("ml", "Deployment", "infer"), (4.0, 16 * GIB, 1.0), 50.0, 2, 12, lead_time_s=75.0
)
WEB = ServingWorkload(Target("web", "Deployment", "web"), (1.0, 2 * GIB, 0.0), 50.0, 2, 12)
GPU_JOB = Target("ml", "PyTorchJob", "vision")
# The forecast's 200 req/s at 50 per replica need 4 replicas; the rise (6) is lent.
PARTS = HeadroomParts(forecast=200.0, rise=290.0, rise_ratio=1.8, observed=160.0, panic_hold=False)


def forecast(later: float) -> Forecast:
    """200 req/s for the next 20 min, then `later`."""
    times = tuple(NOW + 300.0 * i for i in range(6))
    values = (200.0, 200.0, 200.0, 200.0, later, later)
    return Forecast(NOW, times, {0.5: values, 0.95: values})


def gpu_job(remaining_work: float | None, max_trainers: int = 8) -> TrainingJob:
    return TrainingJob(
        GPU_JOB, (4.0, 16 * GIB, 1.0), 2, max_trainers, remaining_work=remaining_work
    )


def test_replicas_held_above_the_sizing_are_lent_up_to_what_the_job_lacks() -> None:
    loan = lend(INFER, forecast(200.0), PARTS, 8, short=3, until_s=600.0, now=NOW)
    assert loan.replicas == 3
    assert "3 held above what it needs lent to finite GPU jobs short of 3 GPUs" in loan.reason
    assert lend(INFER, forecast(200.0), PARTS, 8, short=6, until_s=600.0, now=NOW).replicas == 4


def test_no_replica_the_forecast_needs_before_the_job_is_done_is_lent() -> None:
    # 325 req/s in 20 min needs 7 replicas: a job done within 10 min borrows 4, a job still
    # running then borrows 1.
    assert lend(INFER, forecast(325.0), PARTS, 8, short=8, until_s=600.0, now=NOW).replicas == 4
    assert lend(INFER, forecast(325.0), PARTS, 8, short=8, until_s=1500.0, now=NOW).replicas == 1


def test_nothing_is_lent_without_gpus_a_forecast_or_anything_above_the_need() -> None:
    assert lend(WEB, forecast(200.0), PARTS, 8, short=4, until_s=600.0, now=NOW).replicas == 0
    assert lend(INFER, None, PARTS, 8, short=4, until_s=600.0, now=NOW).replicas == 0
    assert lend(INFER, forecast(200.0), PARTS, 4, short=4, until_s=600.0, now=NOW).replicas == 0
    busy = HeadroomParts(200.0, 290.0, 1.2, 330.0, panic_hold=True)  # observed needs 7
    assert lend(INFER, forecast(200.0), busy, 8, short=4, until_s=600.0, now=NOW).replicas == 1


def test_only_finite_gpu_jobs_below_their_maximum_count() -> None:
    cpu_job = TrainingJob(
        Target("ml", "PyTorchJob", "tabular"), (2.0, 4 * GIB, 0.0), 1, 16, remaining_work=1000.0
    )
    long_running = gpu_job(None)
    assert gpu_jobs_short([cpu_job, long_running], {}) == (0, 0.0)
    short, until = gpu_jobs_short([gpu_job(4000.0)], {GPU_JOB: 4})
    assert short == 4
    assert until > 4000.0 / 4  # at what it holds now, and a restart on top
    # A job at its maximum lacks nothing, but the loan it may stand on lasts until it is done.
    assert gpu_jobs_short([gpu_job(4000.0, max_trainers=4)], {GPU_JOB: 4})[0] == 0


def test_replicas_lent_last_plan_stay_lent_while_the_job_runs() -> None:
    # Serving at 6 (2 lent last plan) sizes itself at 8 again; the job now holds its 8.
    decision = TargetDecision(INFER.target, "serving", 6, 8, "scale up", PARTS)
    serving = ServingPlan((8,), (decision,), {}, {}, (), {})
    inputs = PlanInputs(
        cluster=ClusterView.build([NodeSpec("gpu-0", (32.0, 128 * GIB, 4.0))], []),
        serving=(INFER,),
        jobs=(gpu_job(4000.0),),
        forecasts={INFER.target: forecast(200.0)},
        current={GPU_JOB: 8, INFER.target: 6},
    )
    assert lend_gpu_room(inputs, serving, NOW).desired == (6,)


def test_the_serving_decision_goes_down_by_the_loan_and_says_so() -> None:
    decision = TargetDecision(INFER.target, "serving", 8, 8, "held by stabilisation", PARTS)
    serving = ServingPlan((8,), (decision,), {}, {}, (), {})
    inputs = PlanInputs(
        cluster=ClusterView.build([NodeSpec("gpu-0", (32.0, 128 * GIB, 4.0))], []),
        serving=(INFER,),
        jobs=(gpu_job(4000.0),),
        forecasts={INFER.target: forecast(200.0)},
        current={GPU_JOB: 6, INFER.target: 8},
    )
    lent = lend_gpu_room(inputs, serving, NOW)
    assert lent.desired == (6,)
    assert lent.decisions[0].desired == 6
    assert lent.decisions[0].reason.startswith("held by stabilisation; 2 held above")
