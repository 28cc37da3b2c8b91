"""Persistence with drift: the recent level carries on along its recent slope.

No seasonality at all, which is its strength on shapes a seasonal model misreads: in the
first minutes of a flash crowd or after a level shift the last few intervals say more than
yesterday does. Quantiles are the empirical quantiles of its own errors per step ahead over
the recent history, in log space (errors scale with the level).
"""

from __future__ import annotations

import numpy as np
from numpy.typing import ArrayLike
from pydantic import BaseModel, ConfigDict, Field

from tideshift.events.models import QUANTILE_LEVELS
from tideshift.services.predictor.core.models.base import (
    SECONDS_PER_DAY,
    FloatArray,
    Forecast,
    RegularSeries,
    empirical_quantiles,
    extend_series,
    fill_gaps,
    make_forecast,
    regularize,
)


class DriftConfig(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    # The level is the mean over this much recent history (it tames per-interval noise).
    level_window_s: float = Field(default=300.0, gt=0)
    # The slope is the level's change over this much history, damped per step ahead.
    slope_window_s: float = Field(default=3600.0, gt=0)
    damping: float = Field(default=0.98, gt=0, le=1)
    # Errors from this much recent history calibrate the quantiles.
    residual_window_s: float = Field(default=2 * SECONDS_PER_DAY, gt=0)
    max_horizon_s: float = Field(default=2 * 3600.0, gt=0)
    default_interval_s: float = Field(default=60.0, gt=0)


class Drift:
    def __init__(self, config: DriftConfig | None = None, *, name: str = "drift") -> None:
        self.config = config or DriftConfig()
        self.name = name
        self._series: RegularSeries | None = None
        self._spread: FloatArray = np.zeros((len(QUANTILE_LEVELS), 1))
        self._offset = 1.0

    def _steps(self, seconds: float, interval_s: float) -> int:
        return max(1, round(seconds / interval_s))

    def _max_points(self, interval_s: float) -> int:
        config = self.config
        return (
            self._steps(config.residual_window_s, interval_s)
            + self._steps(config.slope_window_s, interval_s)
            + self._steps(config.level_window_s, interval_s)
            + self._steps(config.max_horizon_s, interval_s)
        )

    def fit(self, timestamps: ArrayLike, values: ArrayLike) -> None:
        series = regularize(timestamps, values, default_interval_s=self.config.default_interval_s)
        self._series = series.tail(self._max_points(series.interval_s))
        history = fill_gaps(self._series.values)
        positive = history[history > 0]
        self._offset = max(0.1 * float(np.median(positive)) if positive.shape[0] else 1.0, 1e-9)
        self._spread = self._calibrate(history, series.interval_s)

    def update(self, timestamps: ArrayLike, values: ArrayLike) -> None:
        if self._series is None:
            self.fit(timestamps, values)
            return
        self._series, _ = extend_series(
            self._series, timestamps, values, max_points=self._max_points(self._series.interval_s)
        )

    def _paths(
        self, history: FloatArray, ends: FloatArray, steps: int, interval: float
    ) -> FloatArray:
        """Point forecasts from each origin (index of its last observation), rows = origins."""
        level_n = self._steps(self.config.level_window_s, interval)
        slope_n = self._steps(self.config.slope_window_s, interval)
        running = np.concatenate([[0.0], np.cumsum(history)])
        ends = ends.astype(np.int64)
        starts = np.maximum(ends + 1 - level_n, 0)
        level = (running[ends + 1] - running[starts]) / (ends + 1 - starts)
        earlier_end = np.maximum(ends - slope_n, 0)
        earlier_start = np.maximum(earlier_end + 1 - level_n, 0)
        earlier = (running[earlier_end + 1] - running[earlier_start]) / (
            earlier_end + 1 - earlier_start
        )
        span = np.maximum(ends - earlier_end, 1)
        slope = (level - earlier) / span
        damping = self.config.damping
        ahead = np.arange(1, steps + 1, dtype=np.float64)
        # Damped trend: sum of damping**k for k = 1..h; the level sits mid-window.
        reach = (level_n - 1) / 2 + (
            ahead if damping == 1.0 else damping * (1 - damping**ahead) / (1 - damping)
        )
        paths: FloatArray = np.maximum(level[:, None] + slope[:, None] * reach[None, :], 0.0)
        return paths

    def _calibrate(self, history: FloatArray, interval: float) -> FloatArray:
        steps = self._steps(self.config.max_horizon_s, interval)
        window = self._steps(self.config.residual_window_s, interval)
        length = history.shape[0]
        origins = np.arange(max(0, length - window - steps), length - 1)
        if origins.shape[0] == 0:
            return np.zeros((len(QUANTILE_LEVELS), steps))
        paths = self._paths(history, origins.astype(np.float64), steps, interval)
        targets = origins[:, None] + np.arange(1, steps + 1)[None, :]
        valid = targets < length
        actual = history[np.minimum(targets, length - 1)]
        errors = np.where(
            valid, np.log(actual + self._offset) - np.log(paths + self._offset), np.nan
        )
        return empirical_quantiles(errors, QUANTILE_LEVELS)

    def predict(self, horizon_steps: int) -> Forecast:
        if self._series is None:
            raise RuntimeError("predict() before fit()")
        series = self._series
        history = fill_gaps(series.values)
        point = self._paths(
            history, np.array([history.shape[0] - 1.0]), horizon_steps, series.interval_s
        )[0]
        columns = np.minimum(np.arange(horizon_steps), self._spread.shape[1] - 1)
        base = np.log(point + self._offset)
        quantiles = {
            level: np.exp(base + self._spread[index, columns]) - self._offset
            for index, level in enumerate(QUANTILE_LEVELS)
        }
        return make_forecast(
            last_timestamp=series.last_timestamp,
            interval_s=series.interval_s,
            point=point,
            quantiles=quantiles,
        )
