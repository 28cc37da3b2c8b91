"""The policy's rules, one table or scenario each, with explicit times."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from tideshift.services.planner.core import (
    ClusterView,
    Forecast,
    NodeSpec,
    PlanInputs,
    PlanState,
    PodSpec,
    PolicyConfig,
    ServingWorkload,
    Target,
    TrainingJob,
    forecast_peak,
    pack_sparse,
    plan,
)

GIB = 2**30
WEB = Target("prod", "Deployment", "web")
JOB_A = Target("ml", "PyTorchJob", "a")
JOB_B = Target("ml", "PyTorchJob", "b")
GPU_JOB = Target("ml", "PyTorchJob", "gpu")
GPU_JOB_2 = Target("ml", "PyTorchJob", "gpu-2")


def cpu_nodes(count: int, cpu: float = 16.0) -> list[NodeSpec]:
    return [NodeSpec(f"n{i}", (cpu, 64.0 * GIB, 0.0)) for i in range(count)]


def flat_forecast(rps: float, *, issued_at: float = 0.0, length_s: float = 3600.0) -> Forecast:
    times = tuple(issued_at + 60.0 * i for i in range(int(length_s // 60)))
    return Forecast(
        issued_at, times, {0.5: tuple(rps for _ in times), 0.9: tuple(rps for _ in times)}
    )


def web(**overrides: object) -> ServingWorkload:
    fields: dict[str, object] = {
        "target": WEB,
        "replica_requests": (1.0, GIB, 0.0),
        "capacity_rps": 10.0,
        "min_replicas": 1,
        "max_replicas": 100,
        "lead_time_s": 30.0,
        "margin_s": 30.0,
        "stabilization_s": 300.0,
        "quantile": 0.9,
    }
    fields.update(overrides)
    return ServingWorkload(**fields)  # type: ignore[arg-type]


def job(target: Target = JOB_A, **overrides: object) -> TrainingJob:
    fields: dict[str, object] = {
        "target": target,
        "trainer_requests": (1.0, GIB, 0.0),
        "min_trainers": 1,
        "max_trainers": 100,
    }
    fields.update(overrides)
    return TrainingJob(**fields)  # type: ignore[arg-type]


def inputs(
    *,
    nodes: list[NodeSpec],
    pods: list[PodSpec] = (),  # type: ignore[assignment]
    serving: tuple[ServingWorkload, ...] = (),
    jobs: tuple[TrainingJob, ...] = (),
    forecasts: dict[Target, Forecast] | None = None,
    current: dict[Target, int] | None = None,
    config: PolicyConfig | None = None,
    cluster_stale: bool = False,
) -> PlanInputs:
    return PlanInputs(
        cluster=ClusterView.build(nodes, pods),
        serving=serving,
        jobs=jobs,
        forecasts=forecasts or {},
        current=current or {},
        config=config or PolicyConfig(),
        cluster_stale=cluster_stale,
    )


def replicas_pods(target: Target, count: int, node: str, request: float = 1.0) -> list[PodSpec]:
    return [PodSpec((request, GIB, 0.0), node, target) for _ in range(count)]


# ---- helpers ---------------------------------------------------------------------------------


def test_pack_respects_every_resource_per_node() -> None:
    free = np.array([[4.0, 4.0, 0.0], [8.0, 1.0, 0.0], [8.0, 8.0, 0.0]])
    nodes, counts = pack_sparse(free, np.array([2.0, 2.0, 0.0]), 10, np.full((3, 3), 8.0))
    placed = np.zeros(len(free), dtype=np.int64)
    placed[nodes] = counts
    assert placed.tolist() == [2, 0, 4]


@pytest.mark.parametrize(
    ("start", "end", "quantile", "expected"),
    [
        (0.0, 60.0, 0.9, 20.0),  # points at 0 and 60
        (30.0, 59.0, 0.9, 10.0),  # the point in force at 30 is the one at 0
        (0.0, 200.0, 0.5, 15.0),
        (0.0, 200.0, 0.8, 30.0),  # next quantile at or above 0.8 is 0.9
        (0.0, 200.0, 0.99, 30.0),  # none at or above: the highest available
    ],
)
def test_forecast_peak_over_the_window(
    start: float, end: float, quantile: float, expected: float
) -> None:
    forecast = Forecast(0.0, (0.0, 60.0, 120.0), {0.5: (5.0, 15.0, 10.0), 0.9: (10.0, 20.0, 30.0)})
    assert forecast_peak(forecast, start, end, quantile) == expected


def test_forecast_peak_none_when_the_forecast_ended() -> None:
    forecast = Forecast(0.0, (0.0, 60.0), {0.9: (1.0, 2.0)})
    assert forecast_peak(forecast, 500.0, 600.0, 0.9) is None


# ---- serving --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("rps", "min_replicas", "max_replicas", "expected"),
    [
        (95.0, 1, 100, 10),  # ceil(95 / 10)
        (100.0, 1, 100, 10),
        (0.0, 2, 100, 2),  # clamped to min
        (5000.0, 1, 40, 40),  # clamped to max
    ],
)
def test_serving_is_sized_from_the_forecast(
    rps: float, min_replicas: int, max_replicas: int, expected: int
) -> None:
    workload = web(min_replicas=min_replicas, max_replicas=max_replicas)
    decision, _ = plan(
        inputs(
            nodes=cpu_nodes(10),
            serving=(workload,),
            forecasts={WEB: flat_forecast(rps)},
            current={WEB: 1},
        ),
        PlanState(),
        0.0,
    )
    assert decision.desired()[WEB] == expected


def test_serving_looks_ahead_lead_time_plus_margin() -> None:
    # Demand jumps at t=120: visible at t=60 (60 + 30 + 30 >= 120), not at t=0.
    times = tuple(float(t) for t in range(0, 600, 60))
    values = tuple(100.0 if t >= 120 else 10.0 for t in times)
    forecast = Forecast(0.0, times, {0.9: values})
    state = PlanState()
    seen = []
    for now in (0.0, 60.0):
        decision, state = plan(
            inputs(
                nodes=cpu_nodes(10),
                serving=(web(),),
                forecasts={WEB: forecast},
                current={WEB: 1},
            ),
            state,
            now,
        )
        seen.append(decision.desired()[WEB])
    assert seen == [1, 10]


def test_serving_scales_up_at_once_and_down_only_after_the_window() -> None:
    workload = web(stabilization_s=300.0)
    timeline = [  # (now, forecast rps, expected replicas)
        (0.0, 50.0, 5),
        (60.0, 100.0, 10),  # up at once
        (120.0, 20.0, 10),  # down held: 10 was recommended within 300 s
        (300.0, 20.0, 10),
        (361.0, 20.0, 2),  # the 10 at t=60 left the window; the highest since is 2
    ]
    state = PlanState()
    current = 5
    for now, rps, expected in timeline:
        decision, state = plan(
            inputs(
                nodes=cpu_nodes(10),
                serving=(workload,),
                forecasts={WEB: flat_forecast(rps, issued_at=now)},
                current={WEB: current},
            ),
            state,
            now,
        )
        current = decision.desired()[WEB]
        assert current == expected, (now, decision.targets[0].reason)


def test_serving_after_restart_holds_until_a_window_was_observed() -> None:
    state = PlanState()
    results = []
    for now in (1000.0, 1200.0, 1301.0):
        decision, state = plan(
            inputs(
                nodes=cpu_nodes(10),
                serving=(web(stabilization_s=300.0),),
                forecasts={WEB: flat_forecast(10.0, issued_at=now)},
                current={WEB: 8},
            ),
            state,
            now,
        )
        results.append(decision.desired()[WEB])
    assert results == [8, 8, 1]


@pytest.mark.parametrize(
    ("forecast", "announced"),
    [
        (None, "no forecast"),
        (flat_forecast(500.0, issued_at=0.0), "stale"),  # issued 10,000 s before now
    ],
)
def test_serving_holds_without_a_fresh_forecast(forecast: Forecast | None, announced: str) -> None:
    decision, _ = plan(
        inputs(
            nodes=cpu_nodes(10),
            serving=(web(),),
            forecasts={WEB: forecast} if forecast else {},
            current={WEB: 7},
        ),
        PlanState(),
        10_000.0,
    )
    assert decision.desired()[WEB] == 7
    assert any(announced in text for text in decision.fallbacks)


# ---- training --------------------------------------------------------------------------------


def test_training_gets_what_serving_leaves() -> None:
    decision, _ = plan(
        inputs(
            nodes=cpu_nodes(4),  # 64 cpu
            serving=(web(),),
            jobs=(job(),),
            forecasts={WEB: flat_forecast(200.0)},  # 20 replicas
            current={WEB: 20},
        ),
        PlanState(),
        0.0,
    )
    assert decision.desired() == {WEB: 20, JOB_A: 44}
    assert decision.node_usage[:, 0].sum() == pytest.approx(64.0)


@pytest.mark.parametrize(
    ("weight_a", "weight_b", "expected_a", "expected_b"),
    [
        (1.0, 1.0, 16, 16),
        (1.0, 3.0, 8, 24),
    ],
)
def test_training_weighted_fair_share(
    weight_a: float, weight_b: float, expected_a: int, expected_b: int
) -> None:
    decision, _ = plan(
        inputs(
            nodes=cpu_nodes(2),  # 32 cpu
            jobs=(job(JOB_A, weight=weight_a), job(JOB_B, weight=weight_b)),
        ),
        PlanState(),
        0.0,
    )
    assert decision.desired() == {JOB_A: expected_a, JOB_B: expected_b}


def test_training_dominant_resource_fairness_across_cpu_and_gpu() -> None:
    # 2 nodes of 16 cpu + 4 gpu. Two GPU jobs' trainers: 1 gpu + 1 cpu (dominant: gpu, 1/8);
    # B's trainer: 2 cpu (dominant: cpu, 1/16). DRF equalises dominant shares until the GPUs
    # run out (4 + 4 of 8, share 1/2); B gets at least that share of the cpu (8 trainers).
    nodes = [NodeSpec(f"g{i}", (16.0, 64.0 * GIB, 4.0)) for i in range(2)]
    decision, _ = plan(
        inputs(
            nodes=nodes,
            jobs=(
                job(GPU_JOB, trainer_requests=(1.0, GIB, 1.0), max_trainers=8),
                job(GPU_JOB_2, trainer_requests=(1.0, GIB, 1.0), max_trainers=8),
                job(JOB_B, trainer_requests=(2.0, GIB, 0.0)),
            ),
        ),
        PlanState(),
        0.0,
    )
    desired = decision.desired()
    assert desired[GPU_JOB] == desired[GPU_JOB_2] == 4
    assert 8 <= desired[JOB_B] <= (32 - 8) // 2


def test_gpus_only_one_job_can_use_are_no_share_of_it() -> None:
    # The same cluster with one GPU job: no other job wants GPUs, so shares count cpu and
    # memory only (A's trainer 1/32 of the cpu, B's 2/32) and A gets all it asks (8 GPUs)
    # instead of 4, which would leave 4 GPUs idle to give B 2 more trainers.
    nodes = [NodeSpec(f"g{i}", (16.0, 64.0 * GIB, 4.0)) for i in range(2)]
    decision, _ = plan(
        inputs(
            nodes=nodes,
            jobs=(
                job(GPU_JOB, trainer_requests=(1.0, GIB, 1.0), max_trainers=8),
                job(JOB_B, trainer_requests=(2.0, GIB, 0.0)),
            ),
        ),
        PlanState(),
        0.0,
    )
    assert decision.desired() == {GPU_JOB: 8, JOB_B: 12}


def test_higher_priority_tier_is_served_first() -> None:
    decision, _ = plan(
        inputs(
            nodes=cpu_nodes(2),  # 32 cpu
            jobs=(
                job(JOB_A, priority=0, min_trainers=1),
                job(JOB_B, priority=10, min_trainers=1, max_trainers=30),
            ),
        ),
        PlanState(),
        0.0,
    )
    assert decision.desired() == {JOB_A: 2, JOB_B: 30}


def test_gang_that_does_not_fit_gets_nothing() -> None:
    decision, _ = plan(
        inputs(
            nodes=cpu_nodes(1),  # 16 cpu
            jobs=(
                job(JOB_A, min_trainers=10, max_trainers=10, submitted_at=0.0),
                job(JOB_B, min_trainers=8, gang_min=8, submitted_at=5.0),
            ),
        ),
        PlanState(),
        10.0,
    )
    assert decision.desired() == {JOB_A: 10, JOB_B: 0}
    assert [item.target for item in decision.infeasible] == [JOB_B]
    assert "gang minimum 8" in decision.infeasible[0].reason


def test_gpu_fragmentation_is_checked_per_node() -> None:
    # 4 GPUs free in total, but 2 per node: a 4-GPU trainer fits nowhere.
    nodes = [NodeSpec(f"g{i}", (32.0, 128.0 * GIB, 4.0)) for i in range(2)]
    other = Target("x", "Deployment", "other")
    pods = [PodSpec((1.0, GIB, 2.0), f"g{i}", other) for i in range(2)]
    decision, _ = plan(
        inputs(
            nodes=nodes,
            pods=pods,
            jobs=(job(GPU_JOB, trainer_requests=(4.0, 8 * GIB, 4.0), min_trainers=1),),
        ),
        PlanState(),
        0.0,
    )
    assert decision.desired()[GPU_JOB] == 0
    assert decision.infeasible[0].target == GPU_JOB


def test_serving_reclaims_from_training_regardless_of_churn_limits() -> None:
    # 32 cpu; 30 trainers running; serving needs 20 replicas: 18 trainers must go now.
    pods = replicas_pods(JOB_A, 15, "n0") + replicas_pods(JOB_A, 15, "n1")
    config = PolicyConfig(max_trainer_removals_per_step=2, min_trainer_lifetime_s=600.0)
    state = PlanState(job_grew_at={JOB_A: 90.0})
    decision, _ = plan(
        inputs(
            nodes=cpu_nodes(2),
            pods=pods,
            serving=(web(),),
            jobs=(job(JOB_A),),
            forecasts={WEB: flat_forecast(200.0, issued_at=100.0)},
            current={WEB: 0, JOB_A: 30},
            config=config,
        ),
        state,
        100.0,
    )
    assert decision.desired() == {WEB: 20, JOB_A: 12}


@pytest.mark.parametrize(
    ("grew_at", "cap", "rebalance_floor", "expected_a", "reason_part"),
    [
        (0.0, 64, 1.0, 16, "tier 0"),  # old enough, under the cap: rebalanced at once
        # By default A gives B only half of B's share of 16: A keeps 24.
        (0.0, 64, 0.5, 24, "above its fair share 16"),
        (95.0, 64, 1.0, 30, "minimum trainer lifetime"),  # grew 5 s ago: deferred
        (0.0, 4, 1.0, 26, "capped"),  # only 4 removals this step
    ],
)
def test_rebalancing_churn_limits(
    grew_at: float, cap: int, rebalance_floor: float, expected_a: int, reason_part: str
) -> None:
    pods = replicas_pods(JOB_A, 15, "n0") + replicas_pods(JOB_A, 15, "n1")
    config = PolicyConfig(
        max_trainer_removals_per_step=cap,
        min_trainer_lifetime_s=60.0,
        rebalance_floor=rebalance_floor,
    )
    decision, _ = plan(
        inputs(
            nodes=cpu_nodes(2),
            pods=pods,
            jobs=(job(JOB_A, submitted_at=0.0), job(JOB_B, submitted_at=90.0)),
            current={JOB_A: 30, JOB_B: 0},
            config=config,
        ),
        PlanState(job_grew_at={JOB_A: grew_at}),
        100.0,
    )
    by_target = {item.target: item for item in decision.targets}
    assert by_target[JOB_A].desired == expected_a
    assert reason_part in by_target[JOB_A].reason
    # Whatever A keeps, B gets the rest (or waits, if A's hold leaves no room for its gang).
    assert by_target[JOB_B].desired == 32 - expected_a


def test_small_rebalances_are_skipped_to_avoid_flapping() -> None:
    # A holds 17 of 32; fair share is 16: a 1-trainer shrink is within tolerance.
    pods = replicas_pods(JOB_A, 9, "n0") + replicas_pods(JOB_A, 8, "n1")
    pods += replicas_pods(JOB_B, 7, "n0") + replicas_pods(JOB_B, 8, "n1")
    decision, _ = plan(
        inputs(
            nodes=cpu_nodes(2),
            pods=pods,
            jobs=(job(JOB_A), job(JOB_B)),
            current={JOB_A: 17, JOB_B: 15},
        ),
        PlanState(),
        1000.0,
    )
    assert decision.desired() == {JOB_A: 17, JOB_B: 15}
    assert decision.changes() == ()


def test_stale_cluster_view_stops_training_growth() -> None:
    pods = replicas_pods(JOB_A, 4, "n0")
    decision, _ = plan(
        inputs(
            nodes=cpu_nodes(2),
            pods=pods,
            jobs=(job(JOB_A),),
            current={JOB_A: 4},
            cluster_stale=True,
        ),
        PlanState(),
        50.0,
    )
    assert decision.desired() == {JOB_A: 4}
    assert decision.fallbacks


def test_every_decision_has_a_reason() -> None:
    decision, _ = plan(
        inputs(
            nodes=cpu_nodes(2),
            serving=(web(),),
            jobs=(job(JOB_A), job(JOB_B)),
            forecasts={WEB: flat_forecast(50.0)},
        ),
        PlanState(),
        0.0,
    )
    assert all(item.reason for item in decision.targets)
    assert len(decision.targets) == 3


def test_no_flapping_on_noisy_flat_load() -> None:
    """Two hours of a flat 200 req/s with +-10 % noise, planned every 15 s against a cluster
    that follows each decision: serving and training settle and stop changing direction."""
    rng = np.random.default_rng(7)
    workload = web(stabilization_s=300.0)
    nodes = cpu_nodes(4)  # 64 cpu
    state = PlanState()
    current = {WEB: 20, JOB_A: 0, JOB_B: 0}
    history: dict[Target, list[int]] = {WEB: [], JOB_A: [], JOB_B: []}
    for step in range(480):
        now = step * 15.0
        noisy = tuple(200.0 * (1 + 0.1 * rng.uniform(-1, 1)) for _ in range(10))
        forecast = Forecast(now, tuple(now + 60.0 * i for i in range(10)), {0.9: noisy})
        pods: list[PodSpec] = []
        for target, count in current.items():
            for i in range(count):
                pods.append(PodSpec((1.0, GIB, 0.0), f"n{i % 4}", target))
        decision, state = plan(
            inputs(
                nodes=nodes,
                pods=pods,
                serving=(workload,),
                jobs=(job(JOB_A, submitted_at=0.0), job(JOB_B, submitted_at=0.0)),
                forecasts={WEB: forecast},
                current=current,
            ),
            state,
            now,
        )
        current = decision.desired()
        for target, counts in history.items():
            counts.append(current[target])
    for target, counts in history.items():
        settled = counts[len(counts) // 4 :]  # after the first half hour
        moves = [b - a for a, b in itertools.pairwise(settled) if b != a]
        reversals = sum(1 for a, b in itertools.pairwise(moves) if a * b < 0)
        assert reversals <= 2, (target, counts)
        assert len(moves) <= 6, (target, moves)
    assert math.isclose(sum(current.values()), 64, abs_tol=2)


def test_missing_forecast_holds_serving_and_stops_training_growth() -> None:
    pods = replicas_pods(WEB, 5, "n0") + replicas_pods(JOB_A, 4, "n1")
    decision, _ = plan(
        inputs(
            nodes=cpu_nodes(2),
            pods=pods,
            serving=(web(),),
            jobs=(job(JOB_A),),
            forecasts={},
            current={WEB: 5, JOB_A: 4},
        ),
        PlanState(),
        50.0,
    )
    assert decision.desired() == {WEB: 5, JOB_A: 4}
    assert "not growing" in decision.targets[1].reason


@pytest.mark.parametrize(
    ("running", "expected", "reason_part"),
    [
        (31, 31, "growth by 1 deferred"),  # room for 32: +1 is within 5 % of 31
        (20, 32, "tier 0"),  # +12 is worth a membership change
    ],
)
def test_small_growth_of_a_running_job_waits(running: int, expected: int, reason_part: str) -> None:
    pods = replicas_pods(JOB_A, running // 2, "n0") + replicas_pods(
        JOB_A, running - running // 2, "n1"
    )
    decision, _ = plan(
        inputs(nodes=cpu_nodes(2), pods=pods, jobs=(job(JOB_A),), current={JOB_A: running}),
        PlanState(),
        1000.0,
    )
    assert decision.desired() == {JOB_A: expected}
    assert reason_part in decision.targets[0].reason
