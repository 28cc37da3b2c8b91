"""Standard statistical models from `statsforecast` (MSTL, AutoTheta), on a coarse grid.

Why coarse: on a 1-minute grid a daily season is 1,440 steps, and statsforecast's MSTL and
AutoTheta then take 15-50 s per fit (measured on this project's machine). On a 15-minute grid
(96 steps a day, two weeks = 1,344 points) MSTL fits in about 0.35 s and AutoTheta in about
2 s, and both refresh their forecast from new data (`forward`, parameters kept) in
milliseconds to a fifth of a second. The model sees the mean of each complete coarse bucket;
its forecast is interpolated between bucket centres back onto the caller's grid. Short-term
detail inside a bucket is left to the other members of the portfolio.
"""

from __future__ import annotations

import math
from typing import Any, Literal

import numpy as np
from numpy.typing import ArrayLike
from pydantic import BaseModel, ConfigDict, Field

from tideshift.events.models import QUANTILE_LEVELS
from tideshift.services.predictor.core.models.base import (
    SECONDS_PER_DAY,
    FloatArray,
    Forecast,
    RegularSeries,
    extend_series,
    make_forecast,
    regularize,
)

# Fewer complete coarse buckets than this (4 h at 15 min) and no model is fitted.
_MIN_COARSE_POINTS = 16
_LEVEL_POINTS = 16

# statsforecast's symmetric interval levels (percent) whose upper bounds are our quantiles.
_INTERVALS = {0.9: 80, 0.95: 90, 0.99: 98}


class StatisticalConfig(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    method: Literal["mstl", "auto_theta"] = "mstl"
    coarse_interval_s: float = Field(default=900.0, gt=0)
    # Coarse history the model is fitted on.
    history_s: float = Field(default=14 * SECONDS_PER_DAY, gt=0)
    season_s: float = Field(default=SECONDS_PER_DAY, gt=0)
    max_horizon_s: float = Field(default=2 * 3600.0, gt=0)
    default_interval_s: float = Field(default=60.0, gt=0)


class Statistical:
    def __init__(self, config: StatisticalConfig | None = None, *, name: str = "") -> None:
        self.config = config or StatisticalConfig()
        self.name = name or self.config.method
        self._series: RegularSeries | None = None
        self._model: Any = None
        self._coarse_s = self.config.coarse_interval_s
        # Start time of the first coarse bucket the current forecast covers, and the forecast.
        self._forecast_start = 0.0
        self._coarse_forecast: dict[float, FloatArray] = {}

    # ---- the coarse view -------------------------------------------------------------------

    def _coarse(self) -> tuple[FloatArray, float]:
        """Means of the complete coarse buckets (aligned to absolute time) and the end of the
        last complete one."""
        assert self._series is not None
        series = self._series
        times = series.start_s + series.interval_s * np.arange(series.values.shape[0])
        bucket = np.floor(times / self._coarse_s + 1e-9).astype(np.int64)
        complete_end = math.floor((series.last_timestamp + series.interval_s) / self._coarse_s)
        keep = bucket < complete_end
        bucket, values = bucket[keep], series.values[keep]
        if bucket.shape[0] == 0:
            return np.zeros(0), complete_end * self._coarse_s
        index = bucket - bucket[0]
        finite = np.isfinite(values)
        sums = np.bincount(index[finite], weights=values[finite], minlength=index[-1] + 1)
        counts = np.bincount(index[finite], minlength=index[-1] + 1)
        means = np.divide(sums, counts, out=np.full(sums.shape, np.nan), where=counts > 0)
        # Buckets with no sample take the value one season earlier (a gap of hours must not
        # become a straight line the model then learns from), else their neighbours' level.
        season = max(1, round(self.config.season_s / self._coarse_s))
        for position in np.flatnonzero(~np.isfinite(means)):
            if position >= season:
                means[position] = means[position - season]
        missing = ~np.isfinite(means)
        if missing.all():
            means = np.zeros_like(means)
        elif missing.any():
            positions = np.arange(means.shape[0])
            means[missing] = np.interp(positions[missing], positions[~missing], means[~missing])
        return means, complete_end * self._coarse_s

    def _coarse_horizon(self) -> int:
        return math.ceil(self.config.max_horizon_s / self._coarse_s) + 2

    def _max_points(self, interval_s: float) -> int:
        return max(2, round((self.config.history_s + self._coarse_s) / interval_s))

    def _build(self, length: int) -> Any:
        # statsforecast is imported on first use: it compiles with numba, which takes seconds,
        # and a predictor that never uses these models should not pay for it.
        from statsforecast.models import MSTL, AutoETS, AutoTheta

        season = max(1, round(self.config.season_s / self._coarse_s))
        if length < 2 * season + 2:
            season = 1
        if self.config.method == "mstl":
            if season == 1:
                return AutoETS(model="ZZN")
            return MSTL(season_length=[season], trend_forecaster=AutoETS(model="ZZN"))
        return AutoTheta(season_length=season)

    def _store(self, raw: dict[str, Any], start: float) -> None:
        mean = np.asarray(raw["mean"], dtype=np.float64)
        forecast = {0.5: mean}
        for level, percent in _INTERVALS.items():
            forecast[level] = np.asarray(raw.get(f"hi-{percent}", mean), dtype=np.float64)
        self._coarse_forecast = forecast
        self._forecast_start = start

    # ---- Forecaster ------------------------------------------------------------------------

    def fit(self, timestamps: ArrayLike, values: ArrayLike) -> None:
        series = regularize(timestamps, values, default_interval_s=self.config.default_interval_s)
        self._coarse_s = max(self.config.coarse_interval_s, series.interval_s)
        self._series = series.tail(self._max_points(series.interval_s))
        coarse, end = self._coarse()
        self._model = None
        if coarse.shape[0] >= _MIN_COARSE_POINTS:
            self._model = self._build(coarse.shape[0])
            try:
                self._model.fit(coarse)
            except (ValueError, NotImplementedError, np.linalg.LinAlgError):
                # statsforecast refuses some short or degenerate series ("tiny datasets").
                self._model = None
        if self._model is None:
            # Too short for any model: hold the recent level until there is more history.
            finite = series.values[np.isfinite(series.values)]
            level = float(np.mean(finite[-_LEVEL_POINTS:])) if finite.shape[0] else 0.0
            self._store({"mean": np.full(self._coarse_horizon(), level)}, end)
            return
        self._store(
            self._model.predict(h=self._coarse_horizon(), level=list(_INTERVALS.values())), end
        )

    def update(self, timestamps: ArrayLike, values: ArrayLike) -> None:
        if self._series is None:
            self.fit(timestamps, values)
            return
        self._series, added = extend_series(
            self._series, timestamps, values, max_points=self._max_points(self._series.interval_s)
        )
        if not added:
            return
        coarse, end = self._coarse()
        if end <= self._forecast_start:
            return
        if self._model is None:
            self.fit(
                self._series.start_s
                + self._series.interval_s * np.arange(self._series.values.shape[0]),
                self._series.values,
            )
            return
        # A new complete bucket: the fitted parameters forecast from the new data.
        try:
            raw = self._model.forward(
                y=coarse, h=self._coarse_horizon(), level=list(_INTERVALS.values())
            )
        except (ValueError, NotImplementedError, np.linalg.LinAlgError):
            return  # keep the last forecast; the next fit starts afresh
        self._store(raw, end)

    def predict(self, horizon_steps: int) -> Forecast:
        if self._series is None:
            raise RuntimeError("predict() before fit()")
        series = self._series
        targets = series.last_timestamp + series.interval_s * np.arange(1, horizon_steps + 1)
        centres = self._forecast_start + self._coarse_s * (
            np.arange(self._coarse_forecast[0.5].shape[0]) + 0.5
        )
        quantiles = {
            level: np.interp(targets + series.interval_s / 2, centres, self._coarse_forecast[level])
            if level in self._coarse_forecast
            else np.interp(targets + series.interval_s / 2, centres, self._coarse_forecast[0.5])
            for level in QUANTILE_LEVELS
        }
        return make_forecast(
            last_timestamp=series.last_timestamp,
            interval_s=series.interval_s,
            point=quantiles[0.5],
            quantiles=quantiles,
        )
