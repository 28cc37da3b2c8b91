"""Forecasting models on synthetic series with known periods and noise, and on edge cases."""

from __future__ import annotations

import numpy as np
import pytest
from pydantic import ValidationError

from tideshift.services.predictor.core.models import (
    DEFAULT_MODEL,
    MODELS,
    QUANTILE_LEVELS,
    build_model,
)
from tideshift.services.predictor.core.models.base import (
    autocorrelation,
    detect_periods,
    dominant_fft_periods,
    regularize,
)
from tideshift.services.predictor.core.models.tidal import Tidal

STEP_S = 300.0  # 5-minute grid: 288 steps a day
DAY = 288
ALL_MODELS = list(MODELS)


def diurnal(
    days: float,
    *,
    noise: float = 0.05,
    weekend_dip: float = 0.0,
    seed: int = 1,
    base: float = 100.0,
) -> tuple[np.ndarray, np.ndarray]:
    """A daily cosine (4:1 peak to trough) with relative Gaussian noise; t = 0 is a Monday."""
    rng = np.random.default_rng(seed)
    steps = int(days * DAY)
    times = np.arange(steps) * STEP_S
    phase = 2 * np.pi * (times / 86400.0 - 14 / 24)
    clean = base * (2.5 + 1.5 * np.cos(phase)) / 4.0
    weekday = (times // 86400).astype(int) % 7
    clean = clean * np.where(weekday >= 5, 1.0 - weekend_dip, 1.0)
    return times, np.maximum(clean * (1 + noise * rng.standard_normal(steps)), 0.0)


def mape(forecast: np.ndarray, actual: np.ndarray) -> float:
    return float(np.mean(np.abs(forecast - actual) / actual))


def check_invariants(forecast, horizon: int) -> None:
    assert forecast.point.shape == (horizon,)
    previous = None
    for level in QUANTILE_LEVELS:
        values = forecast.quantiles[level]
        assert values.shape == (horizon,)
        assert np.all(np.isfinite(values))
        assert np.all(values >= 0)
        if previous is not None:
            assert np.all(values >= previous)
        previous = values
    assert np.all(np.diff(forecast.timestamps) > 0)


# ---- period detection -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("days", "weekend_dip", "expected"),
    [
        (10, 0.0, [DAY]),  # daily only
        (21, 0.4, [DAY, 7 * DAY]),  # daily and a weekend dip: weekly too
        (1.5, 0.0, []),  # less than two cycles: no period claimed
    ],
)
def test_calendar_periods_are_detected_not_assumed(days, weekend_dip, expected) -> None:
    _, values = diurnal(days, weekend_dip=weekend_dip)
    found = detect_periods(values, STEP_S, candidates_s=(86400.0, 7 * 86400.0))
    assert found == expected


def test_no_period_in_white_noise_or_a_trend() -> None:
    rng = np.random.default_rng(3)
    noise = 50 + rng.standard_normal(DAY * 10)
    trend = np.linspace(10, 500, DAY * 10)
    for values in (noise, trend):
        assert detect_periods(values, STEP_S, candidates_s=(86400.0, 7 * 86400.0)) == []
        assert dominant_fft_periods(values, max_periods=3) == []


def test_fft_finds_a_non_calendar_period() -> None:
    steps = np.arange(4000)
    values = 100 + 30 * np.sin(2 * np.pi * steps / 100)
    assert dominant_fft_periods(values, max_periods=2) == [100]


def test_autocorrelation_of_a_constant_is_zero() -> None:
    assert np.all(autocorrelation(np.full(100, 7.0), 10) == 0)


def test_regularize_puts_gaps_on_the_grid() -> None:
    series = regularize([0, 60, 180, 240], [1, 2, 4, 5], default_interval_s=60)
    assert series.interval_s == 60
    np.testing.assert_array_equal(np.isnan(series.values), [False, False, True, False, False])
    assert series.last_timestamp == 240


# ---- accuracy on synthetic series -------------------------------------------------------

# Stated error per model on a daily cosine with 5 % noise, one hour ahead (MAPE, fraction).
ACCURACY = {
    "seasonal_naive_daily": 0.12,
    "seasonal_naive_weekly": 0.12,
    "holt_winters": 0.10,
    "fft": 0.10,
    "tidal": 0.08,
    "drift": 0.15,
    "mstl": 0.10,
    "auto_theta": 0.10,
    "portfolio": 0.08,
}


@pytest.mark.parametrize("name", ALL_MODELS)
def test_models_forecast_a_known_daily_cycle(name: str) -> None:
    times, values = diurnal(15, noise=0.05)
    history = DAY * 14
    model = build_model(name, {"default_interval_s": STEP_S})
    model.fit(times[:history], values[:history])
    forecast = model.predict(12)
    check_invariants(forecast, 12)
    np.testing.assert_allclose(forecast.timestamps, times[history : history + 12])
    assert mape(forecast.point, values[history : history + 12]) < ACCURACY[name]


@pytest.mark.parametrize("name", ALL_MODELS)
def test_update_matches_the_data_it_is_given(name: str) -> None:
    """Updating with new observations moves the origin like a refit would."""
    times, values = diurnal(12, noise=0.02)
    model = build_model(name, {"default_interval_s": STEP_S})
    model.fit(times[: DAY * 10], values[: DAY * 10])
    model.update(times[DAY * 10 : DAY * 11], values[DAY * 10 : DAY * 11])
    forecast = model.predict(6)
    assert forecast.timestamps[0] == times[DAY * 11]
    assert mape(forecast.point, values[DAY * 11 : DAY * 11 + 6]) < 0.15


def test_tidal_quantiles_are_calibrated_on_noise_it_has_not_seen() -> None:
    times, values = diurnal(20, noise=0.1, seed=7)
    model = Tidal()
    start = DAY * 10
    model.fit(times[:start], values[:start])
    misses, total = 0, 0
    for origin in range(start, len(values) - 6, 6):
        model.update(times[origin - 6 : origin], values[origin - 6 : origin])
        forecast = model.predict(6)
        actual = values[origin : origin + 6]
        misses += int(np.sum(actual > forecast.quantiles[0.95]))
        total += 6
    assert 0.02 <= misses / total <= 0.09


def test_tidal_level_follows_a_surge_within_minutes() -> None:
    times, values = diurnal(10, noise=0.03)
    model = Tidal()
    model.fit(times[: DAY * 9], values[: DAY * 9])
    surge = values[DAY * 9 : DAY * 9 + 6] * 3.0  # half an hour at 3x
    model.update(times[DAY * 9 : DAY * 9 + 6], surge)
    forecast = model.predict(1)
    expected_without_surge = values[DAY * 9 + 6]
    assert forecast.point[0] > 2.0 * expected_without_surge


def test_tidal_detects_the_weekly_period_and_uses_it() -> None:
    times, values = diurnal(22, noise=0.03, weekend_dip=0.5)
    model = Tidal()
    friday_end = DAY * 19  # day 19 is a Saturday (t = 0 is a Monday)
    model.fit(times[:friday_end], values[:friday_end])
    assert model.periods == [DAY, 7 * DAY]
    forecast = model.predict(DAY)
    assert mape(forecast.point, values[friday_end : friday_end + DAY]) < 0.12


# ---- edge cases ---------------------------------------------------------------------------


@pytest.mark.parametrize("name", ALL_MODELS)
@pytest.mark.parametrize(
    "case",
    ["constant", "zeros", "short", "single", "gaps", "random_walk", "sparse_zeros"],
)
def test_edge_cases_degrade_gracefully(name: str, case: str) -> None:
    rng = np.random.default_rng(5)
    times = np.arange(DAY * 3) * STEP_S
    if case == "constant":
        values = np.full(times.shape, 42.0)
    elif case == "zeros":
        values = np.zeros(times.shape)
    elif case == "short":
        times, values = times[:5], np.array([3.0, 4.0, 5.0, 4.0, 3.0])
    elif case == "single":
        times, values = times[:1], np.array([9.0])
    elif case == "gaps":
        _, values = diurnal(3)
        keep = rng.random(times.shape) > 0.3
        keep[DAY : DAY + 40] = False  # a 3-hour hole as well
        times, values = times[keep], values[keep]
    elif case == "random_walk":
        values = np.abs(100 + np.cumsum(rng.standard_normal(times.shape)))
    else:
        values = rng.poisson(0.3, times.shape).astype(float)
    model = build_model(name, {"default_interval_s": STEP_S})
    model.fit(times, values)
    forecast = model.predict(12)
    check_invariants(forecast, 12)
    if case == "constant":
        np.testing.assert_allclose(forecast.point, 42.0, rtol=1e-6)
    if case == "zeros":
        np.testing.assert_allclose(forecast.point, 0.0, atol=1e-9)
        np.testing.assert_allclose(forecast.quantiles[0.99], 0.0, atol=1e-9)
    if case == "single":
        assert forecast.point[0] == pytest.approx(9.0)
    model.update([times[-1] + STEP_S], [float(values[-1])])
    check_invariants(model.predict(3), 3)


@pytest.mark.parametrize("name", ALL_MODELS)
def test_fit_on_nothing_is_an_error(name: str) -> None:
    with pytest.raises(ValueError, match="empty"):
        build_model(name).fit([], [])


@pytest.mark.parametrize("name", ALL_MODELS)
def test_predict_before_fit_is_an_error(name: str) -> None:
    with pytest.raises(RuntimeError, match="before fit"):
        build_model(name).predict(3)


def test_registry_builds_by_name_with_typed_settings() -> None:
    assert DEFAULT_MODEL in MODELS
    assert build_model("seasonal_naive_weekly").config.season == "weekly"
    with pytest.raises(ValueError, match="unknown model"):
        build_model("prophet")
    with pytest.raises(ValidationError):
        build_model("tidal", {"level_bins": 0})
    with pytest.raises(ValidationError):
        build_model("holt_winters", {"no_such_field": 1})


def test_holt_winters_multiplicative_falls_back_to_additive_on_zeros() -> None:
    times, values = diurnal(6)
    values[::50] = 0.0
    model = build_model("holt_winters", {"seasonal": "mul", "default_interval_s": STEP_S})
    model.fit(times, values)
    check_invariants(model.predict(12), 12)


# Persistence with drift has no season to keep.
@pytest.mark.parametrize("name", [name for name in ALL_MODELS if name != "drift"])
def test_update_across_a_gap_keeps_the_seasonal_phase(name: str) -> None:
    times, values = diurnal(16, noise=0.02)
    model = build_model(name, {"default_interval_s": STEP_S})
    model.fit(times[: DAY * 14], values[: DAY * 14])
    # Nothing for half a day, then one observation: forecasts continue from there.
    resume = DAY * 14 + DAY // 2
    model.update(times[resume : resume + 1], values[resume : resume + 1])
    forecast = model.predict(12)
    assert forecast.timestamps[0] == times[resume + 1]
    assert mape(forecast.point, values[resume + 1 : resume + 13]) < 0.15
