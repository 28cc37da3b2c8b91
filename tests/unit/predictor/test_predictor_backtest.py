"""The trace reader, durations, the rolling-origin evaluation and `tideshift backtest`."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from tests.fixtures.requirements import shared_trace
from tideshift.loadgen.traces import TraceError
from tideshift.services.predictor.backtest import main
from tideshift.services.predictor.core.evaluation import (
    parse_duration,
    parse_trace,
    plan_backtest,
    run_backtest,
    score,
)
from tideshift.services.predictor.core.models import DEFAULT_MODEL, build_model


@pytest.mark.parametrize(
    ("text", "line", "message"),
    [
        ("", 1, "expected the header"),
        ("time,requests\n0,1\n60,2\n", 1, "expected the header"),
        ("0,1\n60,2\n", 1, "expected the header"),
        ("timestamp_s,requests\n0,1\n60,abc\n", 3, "expected two numbers"),
        ("timestamp_s,requests\n0,1\nx,2\n", 3, "expected two numbers"),
        ("timestamp_s,requests\n0,1\n60,-3\n", 3, "finite count >= 0"),
        ("timestamp_s,requests\n0,1\n60,2\n180,3\n", 4, "irregular step"),
        ("timestamp_s,requests\n0,1\n0,2\n", 3, "must increase"),
        ("timestamp_s,requests\n0,1\n60,2,3\n", 3, "expected 2 fields"),
        ("timestamp_s,requests\n0,1\n", 3, "at least 2 data rows"),
        ("timestamp_s,requests\n0,1\n60,nan\n", 3, "finite"),
    ],
)
def test_malformed_traces_name_the_line(text: str, line: int, message: str) -> None:
    with pytest.raises(TraceError, match=message) as caught:
        parse_trace(text.splitlines(keepends=True), source="t.csv")
    assert caught.value.line == line
    assert str(caught.value).startswith("t.csv")


def test_a_valid_trace_is_read() -> None:
    trace = parse_trace(["timestamp_s,requests\n", "0,4\n", "60,5\n", "\n", "120,0\n"], source="x")
    assert trace.interval_s == 60
    np.testing.assert_array_equal(trace.values, [4, 5, 0])
    assert trace.head(120).values.shape == (2,)


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("300s", 300), ("15m", 900), ("1h", 3600), ("2d", 172800), ("1w", 604800), ("90", 90)],
)
def test_durations(text: str, seconds: float) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "15x", "-5m", "0s", "m"])
def test_bad_durations(text: str) -> None:
    with pytest.raises(ValueError, match="duration"):
        parse_duration(text)


def test_score_by_hand() -> None:
    point = np.array([10.0, 10.0, 0.0])
    upper = np.array([12.0, 8.0, 1.0])
    actual = np.array([10.0, 10.0, 0.0])
    result = score(point, upper, actual, seconds=1.0, origins=1)
    assert result.mape == 0.0
    assert result.smape == 0.0
    # Pinball at 0.95: over-forecasts cost 0.05 per unit, under-forecasts 0.95.
    assert result.pinball_q95 == pytest.approx((0.05 * 2 + 0.95 * 2 + 0.05 * 1) / 3)
    assert result.under_rate_q95 == pytest.approx(1 / 3)


def test_plan_turns_durations_into_steps() -> None:
    trace = parse_trace(
        ["timestamp_s,requests\n"] + [f"{60 * i},{i}\n" for i in range(1000)], source="x"
    )
    plan = plan_backtest(trace, horizon_s=900, step_s=300, refit_s=3600, warmup_s=None)
    assert (plan.horizon_steps, plan.origin_every_steps, plan.refit_every_steps) == (15, 5, 60)
    assert plan.warmup_steps == 250  # a quarter of a trace shorter than 4 weeks
    hourly = parse_trace(["timestamp_s,requests\n", "0,1\n", "3600,2\n", "7200,3\n"], source="h")
    with pytest.raises(ValueError, match="nothing to evaluate"):
        plan_backtest(hourly, horizon_s=900, step_s=300, refit_s=3600, warmup_s=86400)


def test_the_backtest_never_shows_a_model_the_future() -> None:
    seen: list[float] = []

    class Spy:
        name = "spy"

        def fit(self, timestamps, values) -> None:
            seen.append(float(np.max(timestamps)))
            self.model = build_model("seasonal_naive_daily", {"default_interval_s": 60})
            self.model.fit(timestamps, values)

        def update(self, timestamps, values) -> None:
            seen.append(float(np.max(timestamps)))
            self.model.update(timestamps, values)

        def predict(self, horizon_steps: int):
            forecast = self.model.predict(horizon_steps)
            assert forecast.timestamps[0] == seen[-1] + 60
            return forecast

    trace = parse_trace(
        ["timestamp_s,requests\n"] + [f"{60 * i},{i % 7}\n" for i in range(600)], source="x"
    )
    plan = plan_backtest(trace, horizon_s=600, step_s=120, refit_s=1800, warmup_s=6000)
    result = run_backtest(trace, Spy(), plan, clock=lambda: 0.0)
    assert result.origins == len(seen)
    assert seen == sorted(seen)
    assert result.points == result.origins * 10


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "trace.csv"
    path.write_text(text)
    return path


def test_cli_rejects_a_malformed_trace_naming_the_line(tmp_path: Path, capsys) -> None:
    path = write(tmp_path, "timestamp_s,requests\n0,1\n60,-1\n")
    assert main(["--trace", str(path)]) == 2
    assert f"{path} line 3: requests must be a finite count >= 0" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--horizon", "15x"], "--horizon"),
        (["--models", "tidal,prophet"], "--models"),
        ([], "--trace"),
    ],
)
def test_cli_rejects_bad_flags(tmp_path: Path, capsys, flags: list[str], message: str) -> None:
    path = write(tmp_path, "timestamp_s,requests\n0,1\n60,2\n")
    argv = flags if flags == [] else ["--trace", str(path), *flags]
    with pytest.raises(SystemExit) as caught:
        main(argv)
    assert caught.value.code == 2
    assert message in capsys.readouterr().err


def test_cli_missing_file(tmp_path: Path, capsys) -> None:
    assert main(["--trace", str(tmp_path / "nope.csv")]) == 2
    assert "cannot read" in capsys.readouterr().err


def synthetic_trace(tmp_path: Path) -> Path:
    rng = np.random.default_rng(2)
    rows = ["timestamp_s,requests"]
    for step in range(288 * 5):
        rate = 100 + 60 * np.sin(2 * np.pi * step / 288)
        rows.append(f"{step * 300},{rng.poisson(rate)}")
    return write(tmp_path, "\n".join(rows) + "\n")


def test_cli_json_has_the_documented_shape(tmp_path: Path, capsys) -> None:
    path = synthetic_trace(tmp_path)
    code = main(
        ["--trace", str(path), "--horizon", "1h", "--models", "tidal,holt_winters", "--json"]
    )
    assert code == 0
    document = json.loads(capsys.readouterr().out)
    assert set(document) == {"models", "default", "trace", "horizon_s", "choices"}
    assert document["default"] == DEFAULT_MODEL
    assert document["horizon_s"] == 3600
    assert document["trace"] == str(path)
    assert set(document["models"]) == {"tidal", "holt_winters"}
    for figures in document["models"].values():
        assert set(figures) == {"mape", "smape", "pinball_q95", "under_rate_q95", "seconds"}
        assert 0 <= figures["under_rate_q95"] <= 1


def test_cli_table_names_every_model(tmp_path: Path, capsys) -> None:
    path = synthetic_trace(tmp_path)
    assert main(["--trace", str(path), "--models", "seasonal_naive_daily,fft"]) == 0
    captured = capsys.readouterr()
    assert "pinball q95" in captured.out
    assert "seasonal_naive_daily" in captured.out and "fft" in captured.out
    assert "done" in captured.err  # progress and completion go to stderr


@pytest.mark.parametrize(
    ("file_name", "duration", "warmup", "horizon"),
    [
        ("nasa_http_jul95_1min.csv", "4d", "3d", "15m"),
        ("wikipedia_pagecounts_1h.csv", "30d", "23d", "1h"),
    ],
)
def test_backtest_on_the_shared_traces_short_window(
    capsys, file_name: str, duration: str, warmup: str, horizon: str
) -> None:
    path = shared_trace(file_name)
    argv = ["--trace", str(path), "--duration", duration, "--warmup", warmup]
    argv += ["--horizon", horizon, "--step", "15m", "--json", "--quiet"]
    argv += ["--models", f"seasonal_naive_daily,holt_winters,{DEFAULT_MODEL}"]
    assert main(argv) == 0
    models = json.loads(capsys.readouterr().out)["models"]
    best = models[DEFAULT_MODEL]
    assert best["pinball_q95"] < models["seasonal_naive_daily"]["pinball_q95"]
    assert best["under_rate_q95"] < 0.15
    assert all(np.isfinite(list(figures.values())).all() for figures in models.values())
