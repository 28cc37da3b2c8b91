"""The picture's training panel: samples applied per wall minute between progress points."""

from __future__ import annotations

import pytest

from tideshift.services.demo.progress import ProgressPoint, rates


def test_rates_between_consecutive_points_skip_repeated_wall_times() -> None:
    points = {
        "ctr-a": [
            ProgressPoint(clock_s=0.0, wall_s=0.0, applied_samples=0, holdout_loss=None),
            ProgressPoint(clock_s=1800.0, wall_s=30.0, applied_samples=6000, holdout_loss=0.6),
            ProgressPoint(clock_s=1800.0, wall_s=30.0, applied_samples=6000, holdout_loss=0.6),
            ProgressPoint(clock_s=3600.0, wall_s=60.0, applied_samples=9000, holdout_loss=0.5),
        ]
    }
    series = rates(points)["ctr-a"]
    assert series["hours"] == [0.5, 1.0]
    assert series["samples_per_minute"] == [pytest.approx(12000.0), pytest.approx(6000.0)]
    assert series["holdout_loss"] == [0.6, 0.5]
