"""Overcommit: reclaimable capacity per node and batch trainers shrinking first."""

from __future__ import annotations

import numpy as np
import pytest

from tideshift.services.cluster.core.overcommit import (
    OvercommitConfig,
    idle_reservation,
    lendable,
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


def test_what_is_lent_is_the_idle_reservation_within_reclaimable() -> None:
    allocatable = np.array([[16.0, 64 * GIB, 0.0]] * 3)
    requested = np.array([[12.0, 24 * GIB, 0.0], [4.0, 8 * GIB, 0.0], [16.0, 32 * GIB, 0.0]])
    used = np.array([[6.0, 12 * GIB, 0.0], [1.0, 2 * GIB, 0.0], [14.0, 28 * GIB, 0.0]])
    idle = idle_reservation(requested, used)
    lent = lendable(allocatable, used, idle, OvercommitConfig(margin=0.125))
    # 6 idle of 12 requested, within 14 - 6 = 8 reclaimable
    assert lent[0].tolist() == [6.0, 12 * GIB]
    # 3 idle: the 12 cores no request holds are not lent, however little is used
    assert lent[1].tolist() == [3.0, 6 * GIB]
    # 2 idle, but 14 - 14 = 0 reclaimable: the margin is kept
    assert lent[2].tolist() == [0.0, 4 * GIB]


def test_usage_above_requests_leaves_no_idle_reservation() -> None:
    idle = idle_reservation(np.array([[2.0, GIB, 0.0]]), np.array([[3.0, 2 * GIB, 0.0]]))
    assert idle.tolist() == [[0.0, 0.0, 0.0]]
