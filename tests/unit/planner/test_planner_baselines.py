"""The baselines' rules with explicit times, and the registry."""

from __future__ import annotations

import pytest

from tideshift.services.planner.core import (
    ClusterView,
    NodeSpec,
    PlanInputs,
    PodSpec,
    ServingWorkload,
    Target,
    TrainingJob,
)
from tideshift.services.planner.core.baselines import (
    POLICIES,
    EdlPolicy,
    HpaPolicy,
    StaticPolicy,
    make_policy,
)

GIB = 2**30
WEB = Target("prod", "Deployment", "web")
JOB_A = Target("ml", "Job", "a")
JOB_B = Target("ml", "Job", "b")


def web() -> ServingWorkload:
    return ServingWorkload(WEB, (1.0, GIB, 0.0), capacity_rps=10.0, max_replicas=100)


def inputs(
    *,
    observed: float,
    current: int,
    jobs: tuple[TrainingJob, ...] = (),
    pods: list[PodSpec] | None = None,
    nodes: int = 4,
) -> PlanInputs:
    return PlanInputs(
        cluster=ClusterView.build(
            [NodeSpec(f"n{i}", (16.0, 64 * GIB, 0.0)) for i in range(nodes)], pods or []
        ),
        serving=(web(),),
        jobs=jobs,
        forecasts={},
        current={WEB: current},
        observed_rps={WEB: observed},
    )


def test_registry_names_and_default() -> None:
    assert list(POLICIES) == ["tideshift", "static", "hpa", "edl"]
    assert (
        make_policy("static", serving_peak={WEB: 7})
        .plan(inputs(observed=0.0, current=1), None, 0.0)[0]
        .desired()[WEB]
        == 7
    )
    with pytest.raises(KeyError, match="unknown policy"):
        make_policy("nope")


@pytest.mark.parametrize(
    ("observed", "current", "expected"),
    [
        (105.0, 10, 10),  # ratio 1.05: within the 10 % tolerance
        (130.0, 10, 13),  # up at once
        (50.0, 10, 10),  # down: held by the 300 s window (10 recommended at t=0)
    ],
)
def test_hpa_tolerance_and_first_sync(observed: float, current: int, expected: int) -> None:
    policy = HpaPolicy()
    state = policy.initial_state()
    _, state = policy.plan(inputs(observed=100.0, current=10), state, 0.0)
    decision, _ = policy.plan(inputs(observed=observed, current=current), state, 15.0)
    assert decision.desired()[WEB] == expected


def test_hpa_syncs_every_15_s_and_scales_down_after_300_s() -> None:
    policy = HpaPolicy()
    state = policy.initial_state()
    seen = []
    current = 10
    for now, observed in [(0.0, 100.0), (5.0, 300.0), (15.0, 300.0), (30.0, 50.0), (316.0, 50.0)]:
        decision, state = policy.plan(inputs(observed=observed, current=current), state, now)
        current = decision.desired()[WEB]
        seen.append(current)
    # t=5: between syncs; t=15: 30; t=30: down held; t=316: the 30 left the window
    assert seen == [10, 10, 30, 30, 5]


def test_edl_grows_least_fulfilled_then_sheds_most_fulfilled() -> None:
    jobs = (
        TrainingJob(JOB_A, (1.0, GIB, 0.0), min_trainers=2, max_trainers=40),
        TrainingJob(JOB_B, (1.0, GIB, 0.0), min_trainers=2, max_trainers=20),
    )
    policy = EdlPolicy()
    state = policy.initial_state()
    # 64 cpu, serving 10 replicas: trainers grow to 97 % of 64 = 62 cpu requested.
    decision, state = policy.plan(inputs(observed=100.0, current=10, jobs=jobs), state, 0.0)
    desired = decision.desired()
    assert desired[JOB_A] + desired[JOB_B] + 10 == 62
    # equal fulfillment: (a-2)/38 ~ (b-2)/18
    assert abs((desired[JOB_A] - 2) / 38 - (desired[JOB_B] - 2) / 18) < 0.06
    # Serving jumps to 20 replicas: requests exceed 97 %: one trainer less per 5 s tick.
    before = desired
    decision, state = policy.plan(inputs(observed=200.0, current=10, jobs=jobs), state, 15.0)
    after = decision.desired()
    assert sum(after[j] for j in (JOB_A, JOB_B)) == sum(before[j] for j in (JOB_A, JOB_B)) - 1


def test_static_runs_jobs_at_nominal_size() -> None:
    job = TrainingJob(JOB_A, (1.0, GIB, 0.0), min_trainers=2, max_trainers=40, nominal_trainers=15)
    decision, _ = StaticPolicy().plan(inputs(observed=0.0, current=1, jobs=(job,)), None, 0.0)
    assert decision.desired()[JOB_A] == 15
    assert decision.desired()[WEB] == 100  # max_replicas when no peak is given
