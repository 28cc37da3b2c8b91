"""Finite jobs (a known remaining work) share the room beyond their gangs shortest-remaining-
first; jobs of unknown length keep their fair share (issue 26: on edl-training-only fair
shares made identical jobs finish together, at a mean JCT worse than a static partition's;
ordering by age instead took long-running jobs' room)."""

from __future__ import annotations

import numpy as np
import pytest

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
from tideshift.services.planner.core.training.shares import TierJob, TierSolver

GIB = 2**30
NODES = [NodeSpec(f"cpu-{i}", (16.0, 64 * GIB, 0.0)) for i in range(4)]  # 64 cores
A, B, C = (Target("ml", "PyTorchJob", name) for name in ("a", "b", "c"))


def job(target: Target, remaining: float | None, *, submitted_at: float) -> TrainingJob:
    return TrainingJob(
        target,
        (1.0, 2 * GIB, 0.0),
        4,
        40,
        submitted_at=submitted_at,
        remaining_work=remaining,
    )


def desired(*jobs: TrainingJob) -> dict[Target, int]:
    inputs = PlanInputs(
        cluster=ClusterView.build(NODES, []),
        serving=(),
        jobs=jobs,
        forecasts={},
        current={item.target: 0 for item in jobs},
    )
    decision, _ = plan(inputs, PlanState(), 1000.0)
    return decision.desired()


def test_the_job_closest_to_done_gets_the_room_beyond_the_gangs() -> None:
    got = desired(job(A, 50_000.0, submitted_at=0.0), job(B, 5_000.0, submitted_at=1.0))
    assert got == {B: 40, A: 24}


def test_without_remaining_work_the_same_jobs_share_fairly() -> None:
    got = desired(job(A, None, submitted_at=0.0), job(B, None, submitted_at=1.0))
    assert got == {A: 32, B: 32}


def test_a_long_running_job_keeps_its_fair_share_beside_finite_ones() -> None:
    got = desired(
        job(A, None, submitted_at=0.0),
        job(B, 90_000.0, submitted_at=1.0),
        job(C, 1_000.0, submitted_at=2.0),
    )
    # Three fair shares of 64 cores: 22 + 21 + 21; the finite jobs' 42 go shortest first.
    assert got[A] == 22
    assert got[C] == 38
    assert got[B] == 64 - 22 - 38


@pytest.mark.parametrize("remaining", [0.0, 1.0])
def test_a_job_about_to_end_is_first(remaining: float) -> None:
    got = desired(job(A, 10_000.0, submitted_at=0.0), job(B, remaining, submitted_at=1.0))
    assert got[B] == 40


def test_a_negative_remaining_work_is_refused_naming_the_field() -> None:
    with pytest.raises(ValueError, match="remaining_work: expected seconds >= 0"):
        job(A, -1.0, submitted_at=0.0)


def test_a_shorter_cpu_job_does_not_strand_a_gpu_jobs_gpus() -> None:
    gpu_job = TrainingJob(A, (4.0, 8 * GIB, 1.0), 1, 4, submitted_at=0.0, remaining_work=90_000.0)
    cpu_job = TrainingJob(B, (1.0, 2 * GIB, 0.0), 1, 64, submitted_at=1.0, remaining_work=10.0)
    inputs = PlanInputs(
        cluster=ClusterView.build(
            [NodeSpec("gpu-0", (16.0, 64 * GIB, 4.0)), NodeSpec("cpu-0", (16.0, 64 * GIB, 0.0))],
            [],
        ),
        serving=(),
        jobs=(gpu_job, cpu_job),
        forecasts={},
        current={A: 0, B: 0},
    )
    decision, _ = plan(inputs, PlanState(), 1000.0)
    # GPU jobs grow first: the CPU job, closer to done, takes the cores they leave.
    assert decision.desired() == {A: 4, B: 16}


def test_a_finite_jobs_reason_says_how_long_it_has_left() -> None:
    jobs = (job(A, 50_000.0, submitted_at=0.0), job(B, None, submitted_at=1.0))
    inputs = PlanInputs(
        cluster=ClusterView.build(NODES, []),
        serving=(),
        jobs=jobs,
        forecasts={},
        current={A: 0, B: 0},
    )
    decision, _ = plan(inputs, PlanState(), 1000.0)
    reasons = {item.target: item.reason for item in decision.targets}
    # 32 trainers (a fair share beside one job of unknown length): 50,000 / 32 ** 0.8 s.
    assert f"about {50_000 / 32**0.8:.0f} s of work left at 32 trainers" in reasons[A]
    assert "finite job" not in reasons[B]


def test_the_shortest_job_gets_what_packs_per_node_not_what_the_aggregate_allows() -> None:
    # Two 10-core nodes: 4-core trainers fit twice per node, and the long job's floor (one
    # 3-core trainer, running: a started job is not queued again) must still fit: 3 for the
    # short job, although 17 free cores hold 4.
    short = TrainingJob(A, (4.0, GIB, 0.0), 1, 10, submitted_at=0.0, remaining_work=10.0)
    long = TrainingJob(B, (3.0, GIB, 0.0), 1, 10, submitted_at=1.0, remaining_work=1e6)
    inputs = PlanInputs(
        cluster=ClusterView.build(
            [NodeSpec("n0", (10.0, 64 * GIB, 0.0)), NodeSpec("n1", (10.0, 64 * GIB, 0.0))],
            [PodSpec((3.0, GIB, 0.0), "n1", B)],
        ),
        serving=(),
        jobs=(short, long),
        forecasts={},
        current={A: 0, B: 1},
    )
    decision, _ = plan(inputs, PlanState(), 1000.0)
    assert decision.desired() == {A: 3, B: 2}
    assert decision.infeasible == ()


def grown_and_parked(sooner_s: float) -> dict[str, int]:
    """The tier's split of 64 free cores between A, grown to 20 trainers, and B, parked at its
    floor of 4 and `sooner_s` sooner done at 40 trainers than A (neither keeps a trainer
    where it is: the order alone decides)."""
    at_40 = 40**0.8
    request = np.array([1.0, 2 * GIB, 0.0])
    items = [
        TierJob(job(A, at_40 * 200.0, submitted_at=0.0), 20, request, 0, 1 / 64),
        TierJob(job(B, at_40 * (200.0 - sooner_s), submitted_at=1.0), 4, request, 0, 1 / 64),
    ]
    allocatable = np.array([node.allocatable for node in NODES])
    none = np.zeros(0, dtype=np.int64)
    solver = TierSolver(
        items,
        allocatable.copy(),
        allocatable=allocatable,
        entry_job=none,
        entry_node=none,
        entry_kept=none,
    )
    counts = solver.fill([0, 1], [0, 0], [(4, 40), (4, 40)])
    return {"a": counts[0], "b": counts[1]}


def test_a_grown_job_keeps_its_place_against_one_sooner_done_by_less_than_a_restart() -> None:
    # B progressed while A paused to restart: 25 s sooner is less than the 30 s restart
    # (`DEFAULT_RESTART_COST_S`) a swap costs A, so A keeps its place (by remaining work alone
    # the order flipped plan after plan).
    assert grown_and_parked(25.0) == {"a": 40, "b": 24}


def test_a_job_sooner_done_by_more_than_a_restart_goes_first() -> None:
    assert grown_and_parked(35.0) == {"a": 24, "b": 40}
