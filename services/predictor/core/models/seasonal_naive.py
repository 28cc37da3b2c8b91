"""Seasonal naive: tomorrow looks like today (or next week like this week).

The floor every other model must beat. Quantiles are the empirical quantiles of its own
recent errors, so its under-provisioning rate is honest too.
"""

from __future__ import annotations

from typing import Literal

import numpy as np
from numpy.typing import ArrayLike
from pydantic import BaseModel, ConfigDict, Field

from tideshift.events.models import QUANTILE_LEVELS
from tideshift.services.predictor.core.models.base import (
    SECONDS_PER_DAY,
    SECONDS_PER_WEEK,
    FloatArray,
    Forecast,
    RegularSeries,
    empirical_quantiles,
    extend_series,
    fill_gaps,
    make_forecast,
    regularize,
)


class SeasonalNaiveConfig(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    season: Literal["daily", "weekly"] = "daily"
    # Errors from this much recent history calibrate the quantiles.
    residual_window_s: float = Field(default=7 * SECONDS_PER_DAY, gt=0)
    # Used only when the history holds a single point, so no interval can be inferred.
    default_interval_s: float = Field(default=60.0, gt=0)


class SeasonalNaive:
    def __init__(self, config: SeasonalNaiveConfig | None = None, *, name: str = "") -> None:
        self.config = config or SeasonalNaiveConfig()
        self.name = name or f"seasonal_naive_{self.config.season}"
        self._series: RegularSeries | None = None

    def _season_steps(self, interval_s: float) -> int:
        season_s = SECONDS_PER_DAY if self.config.season == "daily" else SECONDS_PER_WEEK
        return max(1, round(season_s / interval_s))

    def _max_points(self, interval_s: float) -> int:
        window = round(self.config.residual_window_s / interval_s)
        return 2 * self._season_steps(interval_s) + window + 2

    def fit(self, timestamps: ArrayLike, values: ArrayLike) -> None:
        series = regularize(timestamps, values, default_interval_s=self.config.default_interval_s)
        self._series = series.tail(self._max_points(series.interval_s))

    def update(self, timestamps: ArrayLike, values: ArrayLike) -> None:
        if self._series is None:
            self.fit(timestamps, values)
            return
        self._series, _ = extend_series(
            self._series,
            timestamps,
            values,
            max_points=self._max_points(self._series.interval_s),
        )

    def predict(self, horizon_steps: int) -> Forecast:
        if self._series is None:
            raise RuntimeError("predict() before fit()")
        series = self._series
        history = fill_gaps(series.values)
        season = self._season_steps(series.interval_s)
        window = round(self.config.residual_window_s / series.interval_s)
        steps = np.arange(1, horizon_steps + 1)
        if history.shape[0] > season:
            # The value one season before each target step (or several seasons, past a season).
            lags = season * np.ceil(steps / season).astype(np.int64)
            point = history[history.shape[0] - lags + steps - 1]
            # Within a season every step's error is a one-season difference: one shared pool.
            lagged_errors = history[season:] - history[:-season]
            shared = empirical_quantiles(lagged_errors[-window:, None], QUANTILE_LEVELS)
            spread = np.repeat(shared, horizon_steps, axis=1)
        else:
            point = np.full(horizon_steps, history[-1])
            spread = empirical_quantiles(
                _naive_errors(history[-window:], horizon_steps), QUANTILE_LEVELS
            )
        return make_forecast(
            last_timestamp=series.last_timestamp,
            interval_s=series.interval_s,
            point=point,
            quantiles={level: point + spread[i] for i, level in enumerate(QUANTILE_LEVELS)},
        )


def _naive_errors(history: FloatArray, horizon_steps: int) -> FloatArray:
    """Errors of "the last value persists" for each step ahead, one row per origin."""
    length = history.shape[0]
    errors = np.full((max(0, length - 1), horizon_steps), np.nan)
    for step in range(1, min(horizon_steps, length - 1) + 1):
        errors[: length - step, step - 1] = history[step:] - history[:-step]
    return errors
