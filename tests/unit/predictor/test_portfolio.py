"""The portfolio forecaster: out-of-sample choice among members, conformal quantiles."""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
import pytest

from tideshift.loadgen.core import families
from tideshift.services.predictor import backtest
from tideshift.services.predictor.core.evaluation import Trace, plan_backtest, run_backtest
from tideshift.services.predictor.core.models import build_model
from tideshift.services.predictor.core.models.portfolio import Portfolio

DAY = 86400.0
# Cheap members keep these tests fast; the mechanism does not depend on which members.
CHEAP = {"members": ("tidal", "drift", "seasonal_naive_daily")}


def _trace(family: str, seed: int, days: float, interval_s: float) -> Trace:
    series = families.generate(family, seed=seed, duration_s=days * DAY, interval_s=interval_s)
    return Trace(family, series.timestamps, series.counts, interval_s)


def test_weights_leave_a_member_that_keeps_missing() -> None:
    """A random walk has no daily cycle: yesterday's value is a poor guess at every step."""
    rng = np.random.default_rng(3)
    times = np.arange(0.0, 6 * DAY, 300.0)
    values = np.maximum(500 + np.cumsum(rng.normal(0, 15, times.shape[0])), 1.0)
    model = build_model("portfolio", {**CHEAP, "top_members": 2, "default_interval_s": 300.0})
    assert isinstance(model, Portfolio)
    model.fit(times[: 4 * 288], values[: 4 * 288])
    for start in range(4 * 288, times.shape[0], 12):
        model.update(times[start : start + 12], values[start : start + 12])
    weights = model.combination_weights(12)
    assert np.allclose(weights.sum(axis=0), 1.0)
    assert np.all(weights[2] == 0.0)  # seasonal_naive_daily
    assert np.all(weights[1] > 0.0)  # drift is among the best on a random walk
    choices = model.choices()
    assert set(choices["led_share"]) == set(CHEAP["members"])


@pytest.mark.slow
@pytest.mark.parametrize(("family", "seed"), [("bursty_high", 1), ("level_shifts", 2)])
def test_q95_under_rate_is_near_five_percent_out_of_sample(family: str, seed: int) -> None:
    trace = _trace(family, seed, 14, 300.0)
    plan = plan_backtest(trace, horizon_s=3600, step_s=900, refit_s=DAY, warmup_s=5 * DAY)
    model = build_model("portfolio", {**CHEAP, "default_interval_s": 300.0})
    score = run_backtest(trace, model, plan, clock=time.perf_counter)
    assert 0.02 <= score.under_rate_q95 <= 0.09


def test_far_future_samples_are_rejected() -> None:
    times = np.arange(0.0, 3 * DAY, 300.0)
    values = 100 + 50 * np.sin(2 * np.pi * times / DAY)
    model = build_model("portfolio", {**CHEAP, "default_interval_s": 300.0})
    assert isinstance(model, Portfolio)
    model.fit(times, values)
    model.update([times[-1] + 300.0, 1e15], [120.0, 3.0])
    assert model.rejected_future == 1
    model.update([times[-1] + 600.0], [125.0])
    assert model.predict(2).timestamps[0] == pytest.approx(times[-1] + 900.0)


def test_backtest_json_reports_the_portfolios_choices(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    series = families.generate("weekly", seed=5, duration_s=4 * DAY, interval_s=600.0)
    path = tmp_path / "weekly.csv"
    path.write_text(families.to_csv(series))
    code = backtest.main(
        ["--trace", str(path), "--models", "portfolio", "--horizon", "1h", "--json", "--quiet"]
    )
    assert code == 0
    document = json.loads(capsys.readouterr().out)
    assert document["default"] == "portfolio"
    weights = document["choices"]["portfolio"]["weights_by_step"]
    assert all(sum(step.values()) == pytest.approx(1.0, abs=0.01) for step in weights.values())
    assert 0 <= document["models"]["portfolio"]["under_rate_q95"] <= 1


def _daily_cycle(days: float) -> tuple[np.ndarray, np.ndarray]:
    times = np.arange(0.0, days * DAY, 300.0)
    return times, 1000 + 600 * np.sin(2 * np.pi * times / DAY)


def test_selection_gives_the_member_with_the_lowest_pinball_loss_the_forecast() -> None:
    """On an exact daily cycle yesterday's value is exact at every step and persistence is
    not: the forecast is the seasonal naive member's, at every level."""
    times, values = _daily_cycle(5)
    members = {"members": ("drift", "seasonal_naive_daily"), "default_interval_s": 300.0}
    model = build_model("portfolio", {**members, "warmup_s": DAY})
    assert isinstance(model, Portfolio)
    model.fit(times[: 4 * 288], values[: 4 * 288])
    for start in range(4 * 288, times.shape[0], 6):
        model.update(times[start : start + 6], values[start : start + 6])
    shares = model.member_weights(12)
    assert np.allclose(shares.sum(axis=0), 1.0)
    assert np.all(shares[1] > 0.99)
    forecast = model.predict(12)
    truth = 1000 + 600 * np.sin(2 * np.pi * forecast.timestamps / DAY)
    for level in (0.5, 0.95):
        assert np.allclose(forecast.quantile(level), truth, rtol=0.01)


def test_the_combination_forecasts_alone_until_candidates_are_scored() -> None:
    times, values = _daily_cycle(2)
    model = build_model("portfolio", {**CHEAP, "default_interval_s": 300.0, "warmup_s": 0.0})
    assert isinstance(model, Portfolio)
    model.fit(times, values)
    weights = model.selection_weights(12)
    assert weights.shape == (len(CHEAP["members"]) + 1, 4, 12)
    assert np.all(weights[-1] == 1.0)
    assert np.all(weights[:-1] == 0.0)
