"""Holt-Winters (ETS) with daily seasonality, the model of the predictive HPA.

statsmodels estimates the smoothing parameters and initial states at each refit; between
refits the standard Holt-Winters recursions advance the states with each new observation,
parameters unchanged, exactly as the fitted model would have. Quantiles are Gaussian around
the point forecast, with the in-sample residual spread growing with the step ahead.
"""

from __future__ import annotations

import math
import sys
import warnings
from typing import Literal

import numpy as np
from numpy.typing import ArrayLike
from pydantic import BaseModel, ConfigDict, Field
from scipy.stats import norm
from statsmodels.tsa.holtwinters import ExponentialSmoothing

from tideshift.events.models import QUANTILE_LEVELS
from tideshift.services.predictor.core.models.base import (
    SECONDS_PER_DAY,
    FloatArray,
    Forecast,
    RegularSeries,
    detect_periods,
    extend_series,
    fill_gaps,
    make_forecast,
    regularize,
)


class HoltWintersConfig(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    seasonal: Literal["add", "mul"] = "add"
    trend: Literal["add", "none"] = "add"
    damped_trend: bool = True
    # Fit on at most this many daily cycles; more costs time and barely changes the fit.
    fit_cycles: int = Field(default=4, ge=2)
    # Autocorrelation a daily period must reach to be used at all.
    min_acf: float = Field(default=0.3, gt=0, lt=1)
    default_interval_s: float = Field(default=60.0, gt=0)


class HoltWinters:
    def __init__(self, config: HoltWintersConfig | None = None, *, name: str = "holt_winters"):
        self.config = config or HoltWintersConfig()
        self.name = name
        self._series: RegularSeries | None = None
        self._level = 0.0
        self._trend = 0.0
        self._seasons: list[float] = []
        self._period = 0
        self._multiplicative = False
        self._alpha = 1.0
        self._beta = 0.0
        self._gamma = 0.0
        self._phi = 1.0
        self._sigma = 0.0

    def fit(self, timestamps: ArrayLike, values: ArrayLike) -> None:
        series = regularize(timestamps, values, default_interval_s=self.config.default_interval_s)
        daily_steps = max(1, round(SECONDS_PER_DAY / series.interval_s))
        series = series.tail(self.config.fit_cycles * daily_steps)
        history = series.values
        self._series = series
        observed = fill_gaps(history)
        periods = detect_periods(
            observed, series.interval_s, candidates_s=[SECONDS_PER_DAY], min_acf=self.config.min_acf
        )
        self._period = periods[0] if periods else 0
        self._multiplicative = (
            self.config.seasonal == "mul" and self._period > 0 and bool(np.all(observed > 0))
        )
        if observed.shape[0] < 10 or float(np.ptp(observed)) == 0.0:
            self._set_flat(observed)
            return
        use_trend = self.config.trend == "add"
        model = ExponentialSmoothing(
            observed,
            trend="add" if use_trend else None,
            damped_trend=use_trend and self.config.damped_trend,
            seasonal=("mul" if self._multiplicative else "add") if self._period else None,
            seasonal_periods=self._period or None,
            initialization_method="heuristic" if self._period else "estimated",
        )
        with warnings.catch_warnings():
            # Convergence chatter: the best parameters found are still used.
            warnings.simplefilter("ignore")
            result = model.fit()
        params = result.params
        self._alpha = float(params["smoothing_level"])
        self._beta = _finite(params.get("smoothing_trend"), 0.0) if use_trend else 0.0
        self._gamma = _finite(params.get("smoothing_seasonal"), 0.0)
        self._phi = _finite(params.get("damping_trend"), 1.0) if use_trend else 1.0
        self._level = float(result.level[-1])
        self._trend = float(result.trend[-1]) if use_trend else 0.0
        self._seasons = (
            list(np.asarray(result.season[-self._period :], dtype=np.float64))
            if (self._period)
            else []
        )
        residuals = np.asarray(result.resid, dtype=np.float64)
        residuals = residuals[np.isfinite(residuals)]
        self._sigma = float(np.std(residuals)) if residuals.shape[0] else 0.0

    def _set_flat(self, observed: FloatArray) -> None:
        self._period = 0
        self._alpha, self._beta, self._gamma, self._phi = 1.0, 0.0, 0.0, 1.0
        self._level = float(observed[-1])
        self._trend = 0.0
        self._seasons = []
        self._sigma = float(np.std(np.diff(observed))) if observed.shape[0] > 1 else 0.0

    def update(self, timestamps: ArrayLike, values: ArrayLike) -> None:
        if self._series is None:
            self.fit(timestamps, values)
            return
        # Every grid step advances the states once (a gap with its own forecasts), so the
        # seasonal index stays aligned with the clock.
        extended, added = extend_series(
            self._series.tail(1), timestamps, values, max_points=sys.maxsize
        )
        for observation in extended.values[-added:] if added else []:
            self._advance(float(observation))
        self._series = extended.tail(1)

    def _advance(self, observation: float) -> None:
        """One Holt-Winters step; a missing observation is replaced by its own forecast."""
        season = (
            self._seasons[-self._period] if self._period else (1.0 if self._multiplicative else 0.0)
        )
        base = self._level + self._phi * self._trend
        if not math.isfinite(observation):
            observation = base * season if self._multiplicative else base + season
        if self._multiplicative:
            level = self._alpha * observation / season + (1 - self._alpha) * base
            new_season = self._gamma * observation / base + (1 - self._gamma) * season
        else:
            level = self._alpha * (observation - season) + (1 - self._alpha) * base
            new_season = self._gamma * (observation - base) + (1 - self._gamma) * season
        self._trend = (
            self._beta * (level - self._level) + (1 - self._beta) * self._phi * self._trend
        )
        self._level = level
        if self._period:
            self._seasons.append(new_season)
            del self._seasons[0]

    def predict(self, horizon_steps: int) -> Forecast:
        if self._series is None:
            raise RuntimeError("predict() before fit()")
        steps = np.arange(1, horizon_steps + 1)
        damping = np.cumsum(self._phi ** steps.astype(np.float64))
        base = self._level + damping * self._trend
        if self._period:
            seasons = np.asarray(self._seasons)[(steps - 1) % self._period]
            point = base * seasons if self._multiplicative else base + seasons
        else:
            point = base
        spread = self._sigma * np.sqrt(1.0 + (steps - 1) * self._alpha**2)
        return make_forecast(
            last_timestamp=self._series.last_timestamp,
            interval_s=self._series.interval_s,
            point=point,
            quantiles={level: point + float(norm.ppf(level)) * spread for level in QUANTILE_LEVELS},
        )


def _finite(value: object, default: float) -> float:
    try:
        number = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return default
    return number if math.isfinite(number) else default
