"""Dominant shares count only the resources two or more of a tier's jobs request."""

from __future__ import annotations

import numpy as np

from tideshift.services.planner.core.training.tier import contended_resources, dominant_share

GIB = 2.0**30
CPU_TRAINER = [2.0, 4 * GIB, 0.0]
GPU_TRAINER = [4.0, 16 * GIB, 1.0]
TOTAL = np.array([512.0, 2048 * GIB, 16.0])


def test_gpus_one_job_requests_are_not_contended() -> None:
    counted = contended_resources(np.array([CPU_TRAINER, CPU_TRAINER, GPU_TRAINER]))
    assert counted.tolist() == [True, True, False]
    # The GPU trainer's share is its cpu (4 / 512), not its GPU (1 / 16).
    assert dominant_share(np.array(GPU_TRAINER), TOTAL, counted) == 4 / 512


def test_gpus_two_jobs_request_are_contended() -> None:
    counted = contended_resources(np.array([CPU_TRAINER, GPU_TRAINER, GPU_TRAINER]))
    assert counted.tolist() == [True, True, True]
    assert dominant_share(np.array(GPU_TRAINER), TOTAL, counted) == 1 / 16


def test_a_job_alone_counts_every_resource() -> None:
    counted = contended_resources(np.array([GPU_TRAINER]))
    assert counted.tolist() == [True, True, True]
