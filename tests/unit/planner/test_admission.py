"""Finite CPU jobs that have not started wait while admitting them would cost the jobs ahead
(shortest-remaining-first, at their maxima) more throughput than they bring (issue 26: on
edl-training-only every job was admitted at once, its parameter servers took room the running
jobs would have used, and all finished together, late)."""

from __future__ import annotations

from tideshift.services.planner.policy import (
    ClusterView,
    NodeSpec,
    PlanInputs,
    PlanState,
    PodSpec,
    Target,
    TrainingJob,
    plan,
)

GIB = 2**30
NODES = [NodeSpec(f"cpu-{i}", (32.0, 128 * GIB, 0.0)) for i in range(4)]  # 128 cores
A, B, C = (Target("ml", "ElasticJob", name) for name in ("a", "b", "c"))
TRAINER = (1.0, GIB, 0.0)
PSERVER = (10.0, GIB, 0.0)  # one parameter server pod per job


def job(target: Target, remaining: float | None, maximum: int, submitted_at: float) -> TrainingJob:
    return TrainingJob(
        target, TRAINER, 10, maximum, submitted_at=submitted_at, remaining_work=remaining
    )


def started(target: Target, node: str) -> list[PodSpec]:
    """A running job: its parameter server and gang of 10 trainers bound on `node`."""
    return [PodSpec(PSERVER, node, target, replica=False)] + [PodSpec(TRAINER, node, target)] * 10


def decide(newcomer: TrainingJob, maximum: int) -> dict[Target, tuple[int, str]]:
    """A and B running (20 cores of parameter servers bound), `newcomer` (C) just arrived:
    its parameter server waits for a node."""
    pods = started(A, "cpu-0") + started(B, "cpu-1") + [PodSpec(PSERVER, None, C, replica=False)]
    jobs = (job(A, 9e5, maximum, 0.0), job(B, 9e5, maximum, 1.0), newcomer)
    inputs = PlanInputs(
        cluster=ClusterView.build(NODES, pods),
        serving=(),
        jobs=jobs,
        forecasts={},
        current={A: 10, B: 10, C: 10},
    )
    decision, _ = plan(inputs, PlanState(), 1000.0)
    return {item.target: (item.desired, item.reason) for item in decision.targets}


def test_a_newcomer_waits_when_it_costs_the_jobs_ahead_more_than_it_brings() -> None:
    # 108 cores beside the bound parameter servers; A and B at 54 fill them. C's floor and
    # parameter server (20 cores) would take 20 of B's trainers: 54**0.8 - 34**0.8 = 7.5 of
    # throughput lost against 10**0.8 = 6.3 gained.
    got = decide(job(C, 9e5, 54, 2.0), 54)
    assert got[C][0] == 0
    assert got[C][1].startswith("queued: finite job")
    assert "need 128 cpu" in got[C][1] and "of the 108 cpu" in got[C][1]
    # The waiting job's parameter server holds no room: A and B get every core.
    assert (got[A][0], got[B][0]) == (54, 54)


def test_a_newcomer_is_admitted_when_it_brings_more_than_it_costs() -> None:
    # At most 50 each, C needs 12 cores beyond the room: B loses 50**0.8 - 38**0.8 = 4.5.
    got = decide(job(C, 9e5, 50, 2.0), 50)
    assert got[C][0] == 10
    # Its parameter server's room is reserved; B, the later of the two, gives way.
    assert (got[A][0], got[B][0]) == (50, 108 - 10 - 50 - 10)


def test_a_newcomer_shorter_than_the_running_jobs_is_admitted() -> None:
    got = decide(job(C, 1e4, 54, 2.0), 54)
    assert got[C][0] == 54
    assert "queued" not in got[C][1]


def test_a_job_of_unknown_length_is_never_held_back() -> None:
    got = decide(job(C, None, 54, 2.0), 54)
    assert got[C][0] >= 10
    assert "queued" not in got[C][1]
