"""Churn worth its restarts (issue 26 part 3): a change of a job's trainers costs it a restart,
so rebalancing lifts the others to `rebalance_floor` of their share only when those moves buy
more work over the horizon than their restarts cost (else only a newcomer's gang gets in), and
a running job grows only when its growth pays its restart; the reasons say so."""

from __future__ import annotations

import numpy as np
import pytest

from tideshift.services.planner.core import (
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
from tideshift.services.planner.core.training.shares import TierJob
from tideshift.services.planner.core.training.tier import change_gain, defer_small_growth

GIB = 2**30
OLD = Target("ml", "PyTorchJob", "old")
NEW = Target("ml", "PyTorchJob", "new")
NODES = [NodeSpec(f"n{i}", (16.0, 64 * GIB, 0.0)) for i in range(2)]
HORIZON = PolicyConfig().release_horizon_s
TOTAL = np.array([100.0, 400 * GIB, 0.0])  # one trainer (1 core) holds 1 % of it


def tier_job(current: int, *, restart_cost_s: float = 30.0, dominant: float = 0.01) -> TierJob:
    job = TrainingJob(OLD, (1.0, GIB, 0.0), 1, 64, restart_cost_s=restart_cost_s)
    return TierJob(job, current, np.array([1.0, GIB, 0.0]), current, dominant)


def test_a_change_gains_its_work_over_the_horizon_less_its_restart() -> None:
    item = tier_job(8)
    expected = (HORIZON - 30.0) * 0.01 * 16**0.8 - HORIZON * 0.01 * 8**0.8
    assert change_gain([item], [8], [16], horizon_s=HORIZON, total=TOTAL) == pytest.approx(expected)
    assert change_gain([item], [8], [8], horizon_s=HORIZON, total=TOTAL) == 0.0


def test_a_trainer_moved_costs_both_jobs_a_restart() -> None:
    giver, taker = tier_job(30), tier_job(2)
    moved = change_gain([giver, taker], [30, 2], [29, 3], horizon_s=HORIZON, total=TOTAL)
    without_restarts = HORIZON * 0.01 * (29**0.8 + 3**0.8 - 30**0.8 - 2**0.8)
    restarts = 30.0 * 0.01 * (29**0.8 + 3**0.8)
    assert moved == pytest.approx(without_restarts - restarts)


def test_growth_that_pays_its_restart_goes_ahead() -> None:
    counts, deferred = defer_small_growth(
        [tier_job(8)], [16], skip=set(), total=TOTAL, config=PolicyConfig(grow_tolerance=0.0)
    )
    assert counts == [16]
    assert deferred == {}


def test_growth_that_does_not_pay_its_restart_waits() -> None:
    # 30 -> 31 trainers: 2.7 % faster for 870 of 900 s, 3.3 % lost to the restart.
    counts, deferred = defer_small_growth(
        [tier_job(30)], [31], skip=set(), total=TOTAL, config=PolicyConfig(grow_tolerance=0.0)
    )
    assert counts == [30]
    assert "do not pay a 30 s restart" in deferred[0]


def plan_newcomer(old_restart_s: float) -> tuple[dict[Target, int], str]:
    """OLD holds 30 of 32 cores; NEW (gang of 2) arrives: its gang fits beside OLD, and
    `rebalance_floor` 0.5 would lift it to half its share (8) with six of OLD's trainers."""
    pods = [PodSpec((1.0, GIB, 0.0), NODES[i % 2].name, OLD) for i in range(30)]
    jobs = (
        TrainingJob(OLD, (1.0, GIB, 0.0), 1, 64, restart_cost_s=old_restart_s),
        TrainingJob(NEW, (1.0, GIB, 0.0), 2, 64, gang_min=2, submitted_at=1.0),
    )
    inputs = PlanInputs(
        cluster=ClusterView.build(NODES, pods),
        serving=(),
        jobs=jobs,
        forecasts={},
        current={OLD: 30, NEW: 0},
        config=PolicyConfig(rebalance_floor=0.5),
    )
    decision, _ = plan(inputs, PlanState(), 1000.0)
    reason = next(item.reason for item in decision.targets if item.target == OLD)
    return decision.desired(), reason


def test_floor_moves_that_pay_their_restarts_are_made() -> None:
    desired, reason = plan_newcomer(old_restart_s=30.0)
    assert desired == {OLD: 24, NEW: 8}
    assert "would not pay" not in reason


def test_floor_moves_that_do_not_pay_leave_the_newcomer_its_gang_only() -> None:
    # A ten-minute restart of the 30-trainer job costs more than 6 trainers buy the newcomer.
    desired, reason = plan_newcomer(old_restart_s=600.0)
    assert desired == {OLD: 30, NEW: 2}
    assert "would not pay its restarts" in reason
    assert "of the tier's work over the next 900 s" in reason
