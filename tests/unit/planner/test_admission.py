"""Finite CPU jobs that have not started wait while admitting them would cost the jobs ahead
(shortest-remaining-first, at their maxima) far more throughput than they bring (issue 26: on
edl-training-only every job was admitted at once, its parameter servers took room the running
jobs would have used, and all finished together, late)."""

from __future__ import annotations

from tideshift.services.planner.core import (
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
    assert "let in" not in got[C][1]  # admitted on its cost, not on its wait
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


# C at most 100 trainers with 9e5 left: 9e5 / 100 ** 0.8 = 22,607 s at its maximum; aged after
# 0.9 x that = 20,346 s of waiting.
AGED_WAIT = 20_400.0


def decide_after(
    waited: float, more: tuple[tuple[Target, str, int], ...] = ()
) -> tuple[dict[Target, tuple[int, str]], PlanState]:
    """As `decide` (C at most 100, costing A and B 6.5x what it brings), C queued `waited`
    seconds ago; A and B with `more` trainers (job, node, count) beyond their 10."""
    pods = started(A, "cpu-0") + started(B, "cpu-1") + [PodSpec(PSERVER, None, C, replica=False)]
    for owner, node, count in more:
        pods += [PodSpec(TRAINER, node, owner)] * count
    trainers = tuple(10 + sum(n for o, _, n in more if o == owner) for owner in (A, B))
    jobs = (job(A, 9e5, 100, 0.0), job(B, 9e5, 100, 1.0), job(C, 9e5, 100, 2.0))
    inputs = PlanInputs(
        cluster=ClusterView.build(NODES, pods),
        serving=(),
        jobs=jobs,
        forecasts={},
        current={A: trainers[0], B: trainers[1], C: 10},
    )
    now = 30_000.0
    decision, state = plan(inputs, PlanState(job_queued_since={C: now - waited}), now)
    return {item.target: (item.desired, item.reason) for item in decision.targets}, state


def test_a_job_that_waited_long_starts_at_its_floor_in_room_no_trainer_holds() -> None:
    got, state = decide_after(AGED_WAIT)
    # 108 cores minus A's and B's 20 bound trainers leave 88 idle: C's floor and parameter
    # server (20) fit, and it starts there though it still costs A and B 6.5x what it brings.
    assert got[C][0] == 10
    assert "queued" not in got[C][1]
    assert got[C][1].endswith(
        "let in at its floor, in room no trainer holds, after waiting 20400 s"
    )
    assert C not in state.job_queued_since


def test_a_job_not_yet_waited_long_enough_stays_queued_and_keeps_its_start() -> None:
    got, state = decide_after(AGED_WAIT - 100.0)
    assert got[C][0] == 0
    assert (
        "waited 20300 s, starts at its floor in room no trainer holds after 20346 s" in (got[C][1])
    )
    # Since when it waits is kept from plan to plan (not restarted).
    assert state.job_queued_since[C] == 30_000.0 - (AGED_WAIT - 100.0)


def test_an_aged_job_does_not_stop_running_trainers() -> None:
    # A and B hold 54 + 50 trainers: 108 - 104 = 4 cores are idle, fewer than C's 20.
    got, _ = decide_after(
        AGED_WAIT, ((A, "cpu-0", 12), (A, "cpu-2", 32), (B, "cpu-1", 12), (B, "cpu-3", 28))
    )
    assert got[C][0] == 0
    assert got[C][1].startswith("queued: finite job")
    # With 20 idle (12 fewer of B's on cpu-3) its floor fits again.
    got, _ = decide_after(
        AGED_WAIT, ((A, "cpu-0", 12), (A, "cpu-2", 32), (B, "cpu-1", 12), (B, "cpu-3", 12))
    )
    assert got[C][0] == 10


def test_a_first_queued_job_is_remembered_from_this_plan() -> None:
    pods = started(A, "cpu-0") + started(B, "cpu-1") + [PodSpec(PSERVER, None, C, replica=False)]
    inputs = PlanInputs(
        cluster=ClusterView.build(NODES, pods),
        serving=(),
        jobs=(job(A, 9e5, 100, 0.0), job(B, 9e5, 100, 1.0), job(C, 9e5, 100, 2.0)),
        forecasts={},
        current={A: 10, B: 10, C: 10},
    )
    _, state = plan(inputs, PlanState(), 1000.0)
    assert state.job_queued_since == {C: 1000.0}
