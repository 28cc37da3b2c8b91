"""Small growth waits only when it is small in the cluster too: one large trainer is no jitter,
nor is one GPU of a few, even when no other job wants GPUs (its fair-share weight then counts
only its cores)."""

from __future__ import annotations

import numpy as np

from tideshift.services.planner.core import PolicyConfig, Target, TrainingJob
from tideshift.services.planner.core.training.shares import TierJob
from tideshift.services.planner.core.training.tier import defer_small_growth

GIB = 2**30


def tier_job(current: int, request: tuple[float, float, float], dominant: float) -> TierJob:
    job = TrainingJob(Target("ml", "ElasticJob", "a"), request, 1, 16)
    return TierJob(job, current, np.array(request), current, dominant)


def grown(item: TierJob, total: tuple[float, float, float]) -> list[int]:
    counts, deferred = defer_small_growth(
        [item], [item.current + 1], skip=set(), total=np.array(total), config=PolicyConfig()
    )
    assert (counts == [item.current]) == (0 in deferred)
    return counts


def test_one_small_trainer_more_waits() -> None:
    assert grown(tier_job(3, (12.0, 0.0, 0.0), 0.004), (3000.0, 0.0, 0.0)) == [3]


def test_one_node_sized_trainer_more_does_not_wait() -> None:
    assert grown(tier_job(3, (12.0, 0.0, 0.0), 12 / 192), (192.0, 0.0, 0.0)) == [4]


def test_one_gpu_of_sixteen_more_does_not_wait() -> None:
    # Its fair-share weight counts only its 4 of 512 cores (no other job wants GPUs).
    gpu_trainer = tier_job(5, (4.0, 16 * GIB, 1.0), 4 / 512)
    assert grown(gpu_trainer, (512.0, 2048 * GIB, 16.0)) == [6]
