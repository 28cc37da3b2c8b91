"""FFT periodicity, as Crane's EffectiveHPA predicts.

Dominant periods come from the spectrum and must be confirmed by the autocorrelation. The
forecast is the history window (a whole number of the longest period) reconstructed from its
strongest spectral components and extended periodically. Between refits nothing but the
clock advances: like Crane, the model has no level that follows the latest observations.
Quantiles are the empirical quantiles of the in-sample reconstruction error.
"""

from __future__ import annotations

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
    dominant_fft_periods,
    empirical_quantiles,
    extend_series,
    fill_gaps,
    make_forecast,
    regularize,
)

_CALENDAR_S = (SECONDS_PER_DAY, SECONDS_PER_WEEK)


class FftConfig(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    # Longest history considered when looking for periods.
    max_history_s: float = Field(default=28 * SECONDS_PER_DAY, gt=0)
    # The reconstruction window holds at most this many cycles of the longest period.
    window_cycles: int = Field(default=3, ge=1)
    max_periods: int = Field(default=3, ge=1)
    # Spectral components (besides the mean) kept in the reconstruction.
    components: int = Field(default=24, ge=1)
    min_acf: float = Field(default=0.3, gt=0, lt=1)
    # Without a period the forecast is the mean of this much recent history.
    fallback_window_s: float = Field(default=3600.0, gt=0)
    default_interval_s: float = Field(default=60.0, gt=0)


class FftForecaster:
    def __init__(self, config: FftConfig | None = None, *, name: str = "fft") -> None:
        self.config = config or FftConfig()
        self.name = name
        self._series: RegularSeries | None = None
        self._template: FloatArray = np.zeros(1)
        self._spread: FloatArray = np.zeros(len(QUANTILE_LEVELS))
        self._steps_since_fit = 0
        self.periods: list[int] = []

    def fit(self, timestamps: ArrayLike, values: ArrayLike) -> None:
        series = regularize(timestamps, values, default_interval_s=self.config.default_interval_s)
        limit = max(2, round(self.config.max_history_s / series.interval_s))
        observed = fill_gaps(series.values[-limit:])
        self._series = series.tail(1)
        self._steps_since_fit = 0
        self.periods = dominant_fft_periods(
            observed,
            max_periods=self.config.max_periods,
            min_acf=self.config.min_acf,
            snap_to=[round(period / series.interval_s) for period in _CALENDAR_S],
        )
        if self.periods:
            longest = max(self.periods)
            cycles = max(1, min(self.config.window_cycles, observed.shape[0] // longest))
            window = observed[-cycles * longest :]
            spectrum = np.fft.rfft(window)
            keep = np.argsort(np.abs(spectrum[1:]))[::-1][: self.config.components] + 1
            filtered = np.zeros_like(spectrum)
            filtered[0] = spectrum[0]
            filtered[keep] = spectrum[keep]
            self._template = np.fft.irfft(filtered, n=window.shape[0])
            residuals = window - self._template
        else:
            recent = observed[-max(1, round(self.config.fallback_window_s / series.interval_s)) :]
            self._template = np.array([float(np.mean(recent))])
            residuals = recent - self._template[0]
        self._spread = empirical_quantiles(residuals[:, None], QUANTILE_LEVELS)[:, 0]

    def update(self, timestamps: ArrayLike, values: ArrayLike) -> None:
        if self._series is None:
            self.fit(timestamps, values)
            return
        self._series, added = extend_series(self._series, timestamps, values, max_points=1)
        self._steps_since_fit += added

    def predict(self, horizon_steps: int) -> Forecast:
        if self._series is None:
            raise RuntimeError("predict() before fit()")
        # The template's first sample sits one template-length before the fit's end.
        positions = (self._steps_since_fit + np.arange(horizon_steps)) % self._template.shape[0]
        point = self._template[positions]
        return make_forecast(
            last_timestamp=self._series.last_timestamp,
            interval_s=self._series.interval_s,
            point=point,
            quantiles={
                level: point + self._spread[index] for index, level in enumerate(QUANTILE_LEVELS)
            },
        )
