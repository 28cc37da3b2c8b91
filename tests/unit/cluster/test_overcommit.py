"""Overcommit: reclaimable capacity per node and batch trainers shrinking first."""

from __future__ import annotations

import numpy as np
import pytest

from tideshift.services.cluster.overcommit import (
    OvercommitConfig,
    batch_evictions,
    reclaimable,
)

GIB = 2.0**30


def test_reclaimable_is_allocatable_minus_usage_minus_margin() -> None:
    allocatable = np.array([[16.0, 64 * GIB, 0.0], [16.0, 64 * GIB, 4.0]])
    used = np.array([[6.0, 16 * GIB, 0.0], [15.5, 60 * GIB, 0.0]])
    lendable = reclaimable(allocatable, used, OvercommitConfig(margin=0.125))
    assert lendable[0].tolist() == [8.0, 40 * GIB]  # 16 - 2 (margin) - 6
    assert lendable[1].tolist() == [0.0, 0.0]  # never negative


def test_rising_serving_usage_evicts_batch_trainers_first() -> None:
    allocatable = np.array([[16.0, 64 * GIB, 0.0]])
    trainer = np.array([2.0, 4 * GIB])
    batch = np.array([[8.0, 16 * GIB]])  # four trainers lent 8 cores
    calm = reclaimable(allocatable, np.array([[4.0, 8 * GIB, 0.0]]), OvercommitConfig(0.0))
    assert batch_evictions(calm, batch, trainer).tolist() == [0]
    busy = reclaimable(allocatable, np.array([[11.0, 8 * GIB, 0.0]]), OvercommitConfig(0.0))
    assert batch_evictions(busy, batch, trainer).tolist() == [2]  # 5 cores left: 2 trainers go


def test_margin_outside_a_fraction_is_rejected_naming_the_field() -> None:
    with pytest.raises(ValueError, match="margin"):
        OvercommitConfig(margin=1.5)
