"""Finite CPU jobs that have not started wait while admitting them would cost the jobs ahead
(shortest-remaining-first, at their maxima) far more throughput than they bring (issue 26: on
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


def test_a_newcomer_waits_when_it_costs_the_jobs_ahead_far_more_than_it_brings() -> None:
    # 108 cores beside the bound parameter servers; A and B at 100 would take 200. C's floor
    # and parameter server (20 cores, 112 beyond the room) would take B to its floor and 22
    # of A's trainers: (100**0.8 - 10**0.8) + (100**0.8 - 78**0.8) = 40.7 of throughput lost,
    # 6.5x the 10**0.8 = 6.3 it brings (a newcomer waits beyond 5x).
    got = decide(job(C, 9e5, 100, 2.0), 100)
    assert got[C][0] == 0
    assert got[C][1].startswith("queued: finite job")
    assert "need 220 cpu" in got[C][1] and "of the 108 cpu" in got[C][1]
    # The waiting job's parameter server holds no room: A and B get every core.
    assert (got[A][0], got[B][0]) == (98, 10)


def test_a_newcomer_is_admitted_when_the_jobs_ahead_lose_little() -> None:
    # At most 60 each, C needs 32 cores beyond the room: B loses 60**0.8 - 28**0.8 = 12.0,
    # 1.9x what C brings.
    got = decide(job(C, 9e5, 60, 2.0), 60)
    assert got[C][0] == 10
    # Its parameter server's room is reserved; B, the later of the two, gives way.
    assert (got[A][0], got[B][0]) == (60, 108 - 10 - 60 - 10)


def test_a_newcomer_shorter_than_the_running_jobs_is_admitted() -> None:
    got = decide(job(C, 1e4, 100, 2.0), 100)
    # First among the three: at its maximum beside A's and B's floors and its parameter server.
    assert got[C][0] == 108 - 10 - 10 - 10
    assert "queued" not in got[C][1]


def test_a_job_of_unknown_length_is_never_held_back() -> None:
    got = decide(job(C, None, 100, 2.0), 100)
    assert got[C][0] >= 10
    assert "queued" not in got[C][1]
