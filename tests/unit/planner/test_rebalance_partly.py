"""Partial rebalancing: a job above its fair share gives back only what lifts the others to
`rebalance_floor` of their shares; nobody below its share loses trainers to it. A new job's
parameter servers waiting for a node get room before trainers do: otherwise the trainers take
the room they need and the job does not start."""

from __future__ import annotations

import math

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
    plan,
)

GIB = 2**30
JOB_A = Target("ml", "PyTorchJob", "a")
JOB_B = Target("ml", "PyTorchJob", "b")
JOB_C = Target("ml", "PyTorchJob", "c")
WEB = Target("prod", "Deployment", "web")
NODES = [NodeSpec(f"n{i}", (16.0, 64 * GIB, 0.0)) for i in range(2)]


def trainers(target: Target, per_node: tuple[int, int]) -> list[PodSpec]:
    return [
        PodSpec((1.0, GIB, 0.0), node.name, target)
        for node, count in zip(NODES, per_node, strict=True)
        for _ in range(count)
    ]


def desired(
    pods: list[PodSpec], current: dict[Target, int], floor: float, *, serving_rps: float = 0.0
) -> dict[Target, int]:
    jobs = tuple(
        TrainingJob(target, (1.0, GIB, 0.0), 1, 100, submitted_at=float(k))
        for k, target in enumerate(current)
    )
    web = ServingWorkload(WEB, (1.0, GIB, 0.0), capacity_rps=10.0, min_replicas=0)
    times = tuple(1000.0 + 60.0 * i for i in range(60))
    forecast = Forecast(1000.0, times, {0.95: tuple(serving_rps for _ in times)})
    inputs = PlanInputs(
        cluster=ClusterView.build(NODES, pods),
        serving=(web,) if serving_rps else (),
        jobs=jobs,
        forecasts={WEB: forecast} if serving_rps else {},
        current=current | ({WEB: 0} if serving_rps else {}),
        config=PolicyConfig(rebalance_floor=floor),
    )
    decision, _ = plan(inputs, PlanState(), 1000.0)
    return decision.desired()


def test_a_newcomer_gets_its_floor_of_the_share_from_the_job_above_only() -> None:
    pods = trainers(JOB_A, (12, 12)) + trainers(JOB_B, (4, 4))
    current = {JOB_A: 24, JOB_B: 8, JOB_C: 0}
    fair = desired(pods, current, floor=1.0)
    partly = desired(pods, current, floor=0.5)
    assert partly[JOB_C] == math.ceil(0.5 * fair[JOB_C])
    assert partly[JOB_B] == 8  # below its share: keeps what it has, gives nothing
    assert partly[JOB_A] == 32 - 8 - partly[JOB_C]
    assert fair[JOB_A] < partly[JOB_A] < 24


def test_no_moves_once_every_job_has_its_floor_of_the_share() -> None:
    pods = trainers(JOB_A, (12, 12)) + trainers(JOB_B, (4, 4))
    current = {JOB_A: 24, JOB_B: 8}
    assert desired(pods, current, floor=0.5) == current
    assert desired(pods, current, floor=1.0) == {JOB_A: 16, JOB_B: 16}


def test_serving_takes_room_from_a_job_held_above_its_share() -> None:
    pods = trainers(JOB_A, (12, 12)) + trainers(JOB_B, (4, 4))
    counts = desired(pods, {JOB_A: 24, JOB_B: 8}, floor=0.5, serving_rps=100.0)
    assert counts[WEB] == 10
    assert counts[JOB_A] + counts[JOB_B] <= 32 - 10


def desired_with_waiting_servers(waiting_companions: int) -> dict[Target, int]:
    pods = [PodSpec((1.0, GIB, 0.0), node.name, JOB_A) for node in NODES for _ in range(16)]
    pods += [PodSpec((1.0, GIB, 0.0), None, JOB_B, replica=False)] * waiting_companions
    inputs = PlanInputs(
        cluster=ClusterView.build(NODES, pods),
        serving=(),
        jobs=(
            TrainingJob(JOB_A, (1.0, GIB, 0.0), 1, 100, submitted_at=0.0),
            TrainingJob(JOB_B, (1.0, GIB, 0.0), 2, 100, submitted_at=1.0),
        ),
        forecasts={},
        current={JOB_A: 32, JOB_B: 0},
        config=PolicyConfig(rebalance_floor=1.0),
    )
    decision, _ = plan(inputs, PlanState(), 1000.0)
    return decision.desired()


def test_trainers_leave_room_for_the_waiting_parameter_servers() -> None:
    assert sum(desired_with_waiting_servers(0).values()) == 32
    with_servers = desired_with_waiting_servers(4)
    assert sum(with_servers.values()) == 32 - 4
    assert with_servers[JOB_B] >= 2
