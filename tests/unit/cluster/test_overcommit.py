"""Overcommit: reclaimable capacity per node and batch trainers shrinking first."""

from __future__ import annotations

import numpy as np
import pytest

from tideshift.services.cluster.overcommit import (
    OvercommitConfig,
    reclaimable,
)

GIB = 2.0**30


def test_reclaimable_is_allocatable_minus_usage_minus_margin() -> None:
    allocatable = np.array([[16.0, 64 * GIB, 0.0], [16.0, 64 * GIB, 4.0]])
    used = np.array([[6.0, 16 * GIB, 0.0], [15.5, 60 * GIB, 0.0]])
    lendable = reclaimable(allocatable, used, OvercommitConfig(margin=0.125))
    assert lendable[0].tolist() == [8.0, 40 * GIB]  # 16 - 2 (margin) - 6
    assert lendable[1].tolist() == [0.0, 0.0]  # never negative


def test_rising_serving_usage_shrinks_what_is_lent() -> None:
    allocatable = np.array([[16.0, 64 * GIB, 0.0]])
    calm = reclaimable(allocatable, np.array([[4.0, 8 * GIB, 0.0]]), OvercommitConfig(0.0))
    busy = reclaimable(allocatable, np.array([[11.0, 8 * GIB, 0.0]]), OvercommitConfig(0.0))
    assert calm[0, 0] == 12.0
    assert busy[0, 0] == 5.0


def test_margin_outside_a_fraction_is_rejected_naming_the_field() -> None:
    with pytest.raises(ValueError, match="margin"):
        OvercommitConfig(margin=1.5)
