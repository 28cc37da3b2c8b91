"""A new job's parameter servers waiting for a node get room before trainers do: otherwise the
trainers take the room they need and the job does not start."""

from __future__ import annotations

from tideshift.services.planner.policy import (
    ClusterView,
    NodeSpec,
    PlanInputs,
    PlanState,
    PodSpec,
    PolicyConfig,
    Target,
    TrainingJob,
    plan,
)

GIB = 2**30
JOB_A = Target("ml", "PyTorchJob", "a")
JOB_B = Target("ml", "PyTorchJob", "b")
NODES = [NodeSpec(f"n{i}", (16.0, 64 * GIB, 0.0)) for i in range(2)]


def desired_with(waiting_companions: int) -> dict[Target, int]:
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
    assert sum(desired_with(0).values()) == 32
    with_servers = desired_with(4)
    assert sum(with_servers.values()) == 32 - 4
    assert with_servers[JOB_B] >= 2
