"""Forecast honesty: coverage of the forecast quantiles against the demand that came, and the
trust it decides (with hysteresis)."""

from __future__ import annotations

import numpy as np
import pytest

from tideshift.events.models import QUANTILE_LEVELS
from tideshift.services.predictor.core.calibration import Calibration, CalibrationRules

STEP = 60.0
RULES = CalibrationRules(window_steps=20, min_steps=10, distrust_below=0.75, trust_again_at=0.85)


def forecast_for(calibration: Calibration, first_step: int, steps: int, q95: float) -> None:
    times = np.arange(first_step, first_step + steps) * STEP
    quantiles = {level: np.full(steps, q95 * level / 0.95) for level in QUANTILE_LEVELS}
    calibration.record(times, quantiles)


def demand(calibration: Calibration, first_step: int, values: list[float]) -> None:
    times = np.arange(first_step, first_step + len(values)) * STEP
    calibration.observe(times, np.asarray(values, dtype=float))


def test_coverage_is_unknown_until_min_steps_then_counts_hits_per_level() -> None:
    calibration = Calibration(step_s=STEP, rules=RULES)
    forecast_for(calibration, 0, 10, q95=100.0)
    demand(calibration, 0, [50.0] * 9)
    assert calibration.coverage() is None
    demand(calibration, 9, [99.0])  # within q0.95 (100), above q0.5 (52.6) and q0.9 (94.7)
    assert calibration.coverage() == pytest.approx(1.0)
    assert calibration.coverage(0.5) == pytest.approx(0.9)
    assert calibration.coverage(0.9) == pytest.approx(0.9)


def test_the_first_forecast_for_a_step_is_the_one_scored() -> None:
    calibration = Calibration(step_s=STEP, rules=CalibrationRules(window_steps=5, min_steps=1))
    forecast_for(calibration, 0, 1, q95=10.0)
    forecast_for(calibration, 0, 1, q95=1000.0)  # a later, wider forecast for the same step
    demand(calibration, 0, [20.0])
    assert calibration.coverage() == 0.0


def test_steps_without_a_sample_are_forgotten_not_scored_late() -> None:
    calibration = Calibration(step_s=STEP, rules=CalibrationRules(window_steps=5, min_steps=1))
    forecast_for(calibration, 0, 3, q95=10.0)
    demand(calibration, 2, [5.0])  # steps 0 and 1 never came
    assert calibration.expected == {}
    assert len(calibration.hits) == 1


def test_trust_is_lost_below_the_floor_and_regained_only_at_the_higher_mark() -> None:
    calibration = Calibration(step_s=STEP, rules=RULES)
    forecast_for(calibration, 0, 200, q95=100.0)
    demand(calibration, 0, [50.0] * 10)
    assert calibration.judge() is None and calibration.trusted
    demand(calibration, 10, [500.0] * 10)  # 10 hits, 10 misses: 50 %
    reason = calibration.judge()
    assert not calibration.trusted
    assert reason is not None and "50%" in reason and "untrusted below 75%" in reason
    # Hits from now on: the window first sheds the old hits (50 % for 10 steps), then the
    # misses; 80 % (16 of 20) is above the floor but below the mark, so still untrusted.
    demand(calibration, 20, [50.0] * 16)
    assert calibration.coverage() == pytest.approx(0.8)
    assert calibration.judge() is not None and not calibration.trusted
    demand(calibration, 36, [50.0])  # 17 of 20 = 85 %
    assert calibration.judge() is None and calibration.trusted
    assert calibration.untrusted_reason() is None


@pytest.mark.parametrize(
    ("window", "minimum", "low", "high", "field"),
    [(10, 11, 0.7, 0.8, "min_steps"), (10, 5, 0.9, 0.8, "distrust_below")],
)
def test_contradictory_rules_are_refused_by_name(
    window: int, minimum: int, low: float, high: float, field: str
) -> None:
    with pytest.raises(ValueError, match=field):
        CalibrationRules(window, minimum, low, high)
