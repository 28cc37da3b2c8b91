"""Small growth waits only when it is small in the cluster too: one large trainer is no jitter."""

from __future__ import annotations

import numpy as np

from tideshift.services.planner.policy import PolicyConfig, Target, TrainingJob
from tideshift.services.planner.policy.churn import defer_small_growth
from tideshift.services.planner.policy.tiers import TierJob


def tier_job(current: int, dominant: float) -> TierJob:
    job = TrainingJob(Target("ml", "ElasticJob", "a"), (12.0, 0.0, 0.0), 1, 16)
    return TierJob(job, current, np.array([12.0, 0.0, 0.0]), current, dominant)


def test_one_small_trainer_more_waits() -> None:
    counts, deferred = defer_small_growth(
        [tier_job(3, dominant=0.004)], [4], skip=set(), config=PolicyConfig()
    )
    assert counts == [3]
    assert 0 in deferred


def test_one_node_sized_trainer_more_does_not_wait() -> None:
    counts, deferred = defer_small_growth(
        [tier_job(3, dominant=12 / 192)], [4], skip=set(), config=PolicyConfig()
    )
    assert counts == [4]
    assert deferred == {}
