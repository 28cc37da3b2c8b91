"""Rolling-origin evaluation of forecasters and the trace format it reads.

Pure: the caller passes in the trace lines, the model constructors and a clock (only used to
report fit+predict time); nothing here opens files or prints.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import numpy as np

from tideshift.loadgen import traces
from tideshift.services.predictor.core.models.base import FloatArray, Forecaster


@dataclass(frozen=True)
class Trace:
    source: str
    timestamps: FloatArray
    values: FloatArray
    interval_s: float

    def head(self, duration_s: float) -> Trace:
        """The first `duration_s` seconds of the trace."""
        keep = self.timestamps < self.timestamps[0] + duration_s
        return Trace(self.source, self.timestamps[keep], self.values[keep], self.interval_s)


def parse_trace(lines: Iterable[str], *, source: str) -> Trace:
    """Read `timestamp_s,requests` rows (validated by `tideshift.loadgen.traces`) as arrays."""
    trace = traces.parse_trace(lines, source)
    return Trace(source, np.asarray(trace.timestamps), np.asarray(trace.counts), trace.interval_s)


_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(s|m|h|d|w)?\s*$")
_UNIT_SECONDS = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "w": 604800.0, None: 1.0}


def parse_duration(text: str) -> float:
    """'15m' -> 900.0; units s, m, h, d, w; a bare number is seconds. Must be positive."""
    match = _DURATION.match(text)
    if not match:
        raise ValueError(f"expected a duration like 300s, 15m, 1h or 2d, got {text!r}")
    seconds = float(match.group(1)) * _UNIT_SECONDS[match.group(2)]
    if seconds <= 0:
        raise ValueError(f"expected a positive duration, got {text!r}")
    return seconds


@dataclass(frozen=True)
class BacktestPlan:
    horizon_steps: int
    origin_every_steps: int
    refit_every_steps: int
    warmup_steps: int


@dataclass(frozen=True)
class Score:
    """Accuracy over every (origin, step ahead) pair; rates are fractions, not percents."""

    mape: float
    smape: float
    pinball_q95: float
    under_rate_q95: float
    seconds: float
    points: int
    origins: int


def plan_backtest(
    trace: Trace,
    *,
    horizon_s: float,
    step_s: float,
    refit_s: float,
    warmup_s: float | None,
) -> BacktestPlan:
    """Turn durations into grid steps; a horizon shorter than the interval is one interval."""
    interval = trace.interval_s
    length = trace.values.shape[0]
    horizon_steps = max(1, math.ceil(horizon_s / interval - 1e-9))
    if warmup_s is None:
        # A week when the trace allows, so weekly cycles can start to show; else a quarter.
        warmup_steps = min(round(7 * 86400 / interval), length // 4)
    else:
        warmup_steps = round(warmup_s / interval)
    warmup_steps = max(2, warmup_steps)
    if warmup_steps + horizon_steps > length:
        raise ValueError(
            f"trace has {length} rows; warm-up ({warmup_steps}) plus horizon ({horizon_steps}) "
            "leaves nothing to evaluate"
        )
    return BacktestPlan(
        horizon_steps=horizon_steps,
        origin_every_steps=max(1, round(step_s / interval)),
        refit_every_steps=max(1, round(refit_s / interval)),
        warmup_steps=warmup_steps,
    )


def origin_indices(length: int, plan: BacktestPlan) -> range:
    """Index of the last observation known at each origin."""
    return range(plan.warmup_steps - 1, length - plan.horizon_steps, plan.origin_every_steps)


def run_backtest(
    trace: Trace,
    model: Forecaster,
    plan: BacktestPlan,
    *,
    clock: Callable[[], float],
    progress: Callable[[int, int], None] | None = None,
) -> Score:
    """Train on the past only: at each origin update (or refit) and forecast the horizon."""
    times, values = trace.timestamps, trace.values
    origins = origin_indices(values.shape[0], plan)
    forecasts = np.zeros((len(origins), plan.horizon_steps))
    upper = np.zeros_like(forecasts)
    actuals = np.zeros_like(forecasts)
    elapsed = 0.0
    last_fit: int | None = None
    last_seen = -1
    for row, origin in enumerate(origins):
        started = clock()
        if last_fit is None or origin - last_fit >= plan.refit_every_steps:
            model.fit(times[: origin + 1], values[: origin + 1])
            last_fit = origin
        else:
            model.update(times[last_seen + 1 : origin + 1], values[last_seen + 1 : origin + 1])
        forecast = model.predict(plan.horizon_steps)
        elapsed += clock() - started
        last_seen = origin
        forecasts[row] = forecast.point
        upper[row] = forecast.quantiles[0.95]
        actuals[row] = values[origin + 1 : origin + 1 + plan.horizon_steps]
        if progress is not None:
            progress(row + 1, len(origins))
    return score(forecasts, upper, actuals, seconds=elapsed, origins=len(origins))


def score(
    point: FloatArray, upper: FloatArray, actual: FloatArray, *, seconds: float, origins: int
) -> Score:
    point, upper, actual = point.ravel(), upper.ravel(), actual.ravel()
    positive = actual > 0
    mape = (
        float(np.mean(np.abs(point - actual)[positive] / actual[positive]))
        if (positive.any())
        else float("nan")
    )
    denominator = np.abs(point) + np.abs(actual)
    with np.errstate(divide="ignore", invalid="ignore"):
        smape_terms = np.where(denominator > 0, 2 * np.abs(point - actual) / denominator, 0.0)
    difference = actual - upper
    pinball = np.maximum(0.95 * difference, (0.95 - 1.0) * difference)
    return Score(
        mape=mape,
        smape=float(np.mean(smape_terms)),
        pinball_q95=float(np.mean(pinball)),
        under_rate_q95=float(np.mean(actual > upper)),
        seconds=seconds,
        points=int(actual.shape[0]),
        origins=origins,
    )
