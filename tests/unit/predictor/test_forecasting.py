"""The predictor's pure forecasting decisions: samples kept, refit cadence, past steps and
stale widening, with time passed in."""

from __future__ import annotations

import numpy as np
import pytest

from tideshift.services.predictor.core.forecasting import (
    MAX_STALE_WIDENING,
    Cadence,
    WorkloadModel,
    grid,
    published,
    warm_up,
    widening,
)
from tideshift.services.predictor.core.models import MODELS
from tideshift.services.predictor.core.models.base import make_forecast

CADENCE = Cadence(step_s=60.0, horizon_s=300.0, history_s=3600.0, refit_s=600.0)


def daily(times: np.ndarray) -> np.ndarray:
    return 100 + 50 * np.sin(2 * np.pi * times / 86400)


def fitted(now: float = 3600.0) -> WorkloadModel:
    model = WorkloadModel(CADENCE, "seasonal_naive_daily")
    start, end = model.window(now)
    times = grid(start, end, CADENCE.step_s)
    fresh, reason = model.take(times, daily(times), end=end)
    assert reason is None
    model.learn(fresh=fresh, now=now)
    return model


def test_window_asks_for_the_whole_history_then_only_new_steps() -> None:
    model = WorkloadModel(CADENCE, "seasonal_naive_daily")
    assert model.window(3630.0) == (0.0, 3600.0)
    model.absorb(np.array([3540.0, 3600.0]), np.array([1.0, 2.0]))
    assert model.window(3730.0) == (3660.0, 3720.0)
    assert model.window(3610.0) == (3600.0, 3600.0)  # nothing new: an empty range


def test_absorb_keeps_valid_new_samples_within_the_history() -> None:
    model = WorkloadModel(CADENCE, "seasonal_naive_daily")
    assert model.absorb(np.array([0.0, 60.0, 120.0]), np.array([1.0, np.nan, -1.0])) == 1
    assert model.absorb(np.array([0.0, 3660.0]), np.array([5.0, 2.0])) == 1  # 0 is not new
    np.testing.assert_array_equal(model.timestamps, [3600.0])  # 0 fell out of the hour


def test_a_sample_is_kept_at_the_start_of_the_step_it_measures() -> None:
    """A rate query stamped t measures [t - step, t); the forecast's value at t holds for
    [t, t + step): the sample stamped 3600 is the step from 3540, and the next step the
    model forecasts is the one from 3600, in force at once."""
    model = fitted()
    assert model.newest == 3600.0 - 60 and model.covered_until == 3600.0
    forecast = model.forecast(3600.0 + 10)
    assert forecast is not None and forecast.timestamps[0] == 3600.0
    assert model.window(3600.0 + 70) == (3660.0, 3660.0)  # the next query: no step skipped


def test_unusable_before_any_sample_and_after_stale_after_without_new_ones() -> None:
    model = WorkloadModel(CADENCE, "seasonal_naive_daily")
    assert model.unusable(fresh=0, end=0.0) is not None
    model.absorb(np.array([0.0]), np.array([1.0]))
    assert model.unusable(fresh=0, end=CADENCE.stale_after_s) is None
    reason = model.unusable(fresh=0, end=CADENCE.stale_after_s + 60)
    assert reason is not None and "since 1970-01-01T00:00:00" in reason


def test_refits_on_the_cadence_and_updates_in_between() -> None:
    model = fitted()
    first = model.model
    assert not model.refit_due(3600.0 + 540) and model.refit_due(3600.0 + 600)
    model.absorb(np.array([3660.0]), np.array([100.0]))
    assert model.next_model(fresh=1, now=3660.0) is None  # updated in place
    assert model.model is first
    model.absorb(np.array([4200.0]), np.array([100.0]))
    model.learn(fresh=1, now=4200.0)
    assert model.model is not first and model.last_fit_at == 4200.0


def test_forecast_skips_past_steps() -> None:
    model = fitted()
    forecast = model.forecast(3600.0 + 150)
    assert forecast is not None
    assert model.behind(3600.0 + 150) == 2
    assert forecast.timestamps[0] == 3600.0 + 120  # 3600 and 3660 are past
    assert forecast.horizon_steps == 5


def test_outage_begins_once_ends_once_and_widens_with_its_length() -> None:
    model = fitted()
    assert model.begin_outage(now=3600.0, reason="down")
    assert not model.begin_outage(now=3660.0, reason="still down")
    assert model.outage_reason == "down"
    stale = model.forecast(5400.0)
    assert model.end_outage(now=5400.0) == pytest.approx(1800.0)
    assert model.end_outage(now=5460.0) is None and model.outage_reason == ""
    plain = model.forecast(5400.0)
    assert stale is not None and plain is not None
    assert widening(CADENCE, outage_s=1800.0) == pytest.approx(0.25 + 0.5 * 0.5)
    np.testing.assert_array_equal(stale.quantiles[0.5], plain.quantiles[0.5])
    np.testing.assert_allclose(
        stale.quantiles[0.95], np.maximum(plain.quantiles[0.5], plain.quantiles[0.95] * 1.5)
    )


def test_widening_is_capped() -> None:
    assert widening(CADENCE, outage_s=0.0) == CADENCE.stale_widening
    assert widening(CADENCE, outage_s=100 * 3600.0) == MAX_STALE_WIDENING


def test_published_widens_upper_quantiles_never_below_the_median() -> None:
    forecast = make_forecast(
        last_timestamp=0.0,
        interval_s=60.0,
        point=[10.0, 10.0, 10.0],
        quantiles={0.5: [10.0, 10.0, 10.0], 0.9: [12.0] * 3, 0.95: [14.0] * 3, 0.99: [20.0] * 3},
    )
    widened = published(forecast, first=1, widen_by=0.5)
    np.testing.assert_array_equal(widened.timestamps, [120.0, 180.0])
    np.testing.assert_array_equal(widened.quantiles[0.5], [10.0, 10.0])
    np.testing.assert_array_equal(widened.quantiles[0.95], [21.0, 21.0])
    np.testing.assert_array_equal(widened.quantiles[0.99], [30.0, 30.0])


def test_a_relapse_soon_after_recovery_continues_the_outage_it_ended() -> None:
    model = fitted()
    stale_after = CADENCE.stale_after_s
    assert model.begin_outage(now=3600.0, reason="refused")
    assert model.end_outage(now=3601.0) == pytest.approx(1.0)
    # The restarted source answered from what it had, then had nothing again: one outage.
    assert not model.begin_outage(now=3601.0 + stale_after, reason="no samples")
    assert model.outage_since == 3600.0 and model.outage_reason == "no samples"
    assert model.end_outage(now=3700.0) == pytest.approx(100.0)
    # Later than stale_after after a recovery, a failure is a new outage, logged anew.
    assert model.begin_outage(now=3700.0 + stale_after + 1.0, reason="refused")
    assert model.outage_since == 3700.0 + stale_after + 1.0


@pytest.mark.parametrize("name", sorted(MODELS))
def test_every_model_warms_up_on_the_made_up_wave(name: str) -> None:
    forecast = warm_up(name, CADENCE)
    # The wave runs 90..110: every model gives a plausible, ordered next step.
    low, high = forecast.quantiles[0.5][0], forecast.quantiles[0.99][0]
    assert 60.0 <= low <= high <= 200.0
