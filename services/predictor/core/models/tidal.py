"""Tidal: a seasonal forecaster, the portfolio's first member (the default forecaster is the
portfolio, `portfolio.py`).

Design, in the order the data flows:

1. Log space. Traffic swings multiplicatively (a 4:1 day/night ratio scales the noise with
   it), so the model works on z = log(y + c), with c a small fraction of the median so that
   zero intervals stay finite and low counts do not dominate the error.
2. Periods are detected, never assumed: calendar candidates (day, week) and the strongest
   FFT periods are each kept only if the autocorrelation confirms them and at least two
   cycles of history exist. No confirmed period means no seasonal component.
3. Robust multi-seasonal decomposition, shortest period first: each cycle is centred on its
   own median (so a day-to-day level change is not mistaken for shape), the profile is the
   median across the last few cycles (so one surge day or holiday does not imprint on the
   profile), smoothed circularly across the phase. The weekly profile is taken from what the
   daily one leaves, so it only learns how weekdays differ.
4. Two-speed level on what is left: a fast exponentially weighted level that follows a surge
   within minutes, and a slow one (about a day) the forecast reverts to as the horizon grows
   (z_hat = S + M + phi^h (L - M)). The fast rate and the reversion phi are chosen on the
   history by the absolute error over the horizons the planner uses.
5. Quantiles are conformal by horizon step: the empirical quantiles of the model's own
   out-of-sample errors (in log space) at each step ahead over a recent window, refreshed as
   observations arrive. They widen when the model has recently been wrong and narrow when it
   has been right, without any distributional assumption.
"""

from __future__ import annotations

import logging
import math

import numpy as np
from numpy.typing import ArrayLike
from pydantic import BaseModel, ConfigDict, Field

from tideshift.events.models import QUANTILE_LEVELS
from tideshift.services.predictor.core.models.base import (
    SECONDS_PER_DAY,
    SECONDS_PER_WEEK,
    FloatArray,
    Forecast,
    detect_periods,
    dominant_fft_periods,
    fill_gaps,
    make_forecast,
    regularize,
)
from tideshift.services.predictor.core.models.seasonal_profile import robust_profile
from tideshift.services.predictor.core.models.tidal_calibration import (
    ErrorRing,
    NDBoolArray,
    NDIntArray,
    calibration_errors,
    ewma,
    left_pad,
    level_loss,
    probe_steps,
    spread_by_step,
)

log = logging.getLogger(__name__)


class TidalConfig(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    # Periods proposed from the calendar; each still has to be confirmed by the data.
    calendar_periods_s: tuple[float, ...] = (SECONDS_PER_DAY, SECONDS_PER_WEEK)
    # Extra periods proposed by the spectrum (0 disables).
    fft_periods: int = Field(default=1, ge=0)
    min_acf: float = Field(default=0.3, gt=0, lt=1)
    # Cycles whose median forms the profile, for periods up to a day and for longer ones.
    short_period_cycles: int = Field(default=7, ge=1)
    long_period_cycles: int = Field(default=4, ge=1)
    # Circular smoothing of each profile, as a fraction of its period (1/96 of a day = 15 min).
    profile_smoothing: float = Field(default=1 / 96, ge=0, lt=0.5)
    # Offset c in log(y + c), as a fraction of the median of the positive values.
    log_offset_fraction: float = Field(default=0.1, gt=0)
    # Candidate fast-level rates and per-step reversion factors tried at each fit.
    level_rates: tuple[float, ...] = (0.02, 0.05, 0.1, 0.2, 0.35, 0.6, 1.0)
    reversions: tuple[float, ...] = (0.9, 0.97, 0.99, 0.997, 0.999, 1.0)
    # Half-life of the slow level, in seconds.
    slow_half_life_s: float = Field(default=SECONDS_PER_DAY, gt=0)
    # Longest horizon the quantiles are calibrated for; beyond it the last step's spread holds.
    max_horizon_s: float = Field(default=2 * 3600.0, gt=0)
    # Recent out-of-sample errors that calibrate the quantiles.
    calibration_window_s: float = Field(default=3 * SECONDS_PER_DAY, gt=0)
    # ... but never fewer errors than this, so coarse (hourly) series still get a tail.
    min_calibration_errors: int = Field(default=600, ge=1)
    # Quantiles are recomputed from the errors after this many new observations.
    recalibrate_every_s: float = Field(default=3600.0, gt=0)
    # Errors are pooled separately for this many forecast-level bins (1 = one pool).
    level_bins: int = Field(default=4, ge=1)
    # CUSUM on one-step errors (in their sds): errors beyond `shift_slack` accumulate and
    # reaching `shift_threshold` resets the fast level (0 = off). High values: only real
    # surges, not Poisson noise, may move the level this way.
    shift_slack: float = Field(default=1.0, ge=0)
    shift_threshold: float = Field(default=20.0, ge=0)
    # Step of the online quantile correction, relative to the q0.99 - q0.5 spread (0 = off).
    quantile_tracking_rate: float = Field(default=0.05, ge=0)
    max_history_s: float = Field(default=35 * SECONDS_PER_DAY, gt=0)
    default_interval_s: float = Field(default=60.0, gt=0)


class Tidal:
    def __init__(self, config: TidalConfig | None = None, *, name: str = "tidal") -> None:
        self.config = config or TidalConfig()
        self.name = name
        self.periods: list[int] = []
        self._fitted = False
        self._interval = self.config.default_interval_s
        self._last_timestamp = 0.0
        self._last_index = 0
        self._offset = 1.0
        # Each profile is (period, anchor index, shape); S(i) = shape[(i - anchor) % period].
        self._profiles: list[tuple[int, int, FloatArray]] = []
        self._rate = 0.1
        self._slow_rate = 0.01
        self._reversion = 1.0
        self._max_steps = 1
        self._fast_history: FloatArray = np.zeros(1)
        self._slow_history: FloatArray = np.zeros(1)
        # Out-of-sample log errors and the log forecasts they belong to: rows = target
        # intervals, columns = steps ahead.
        self._errors = ErrorRing(capacity=1, steps=1)
        self._bin_edges: FloatArray = np.zeros(0)
        self._spreads: FloatArray = np.zeros((1, len(QUANTILE_LEVELS), 1))
        self._pending_rows = 0
        # Online correction of each quantile (log space), kept across refits: it nudges a
        # quantile up after each miss and down after each hit so its miss rate converges to
        # 1 - level even when the window's errors are not exchangeable with tomorrow's.
        self._corrections = np.zeros((len(QUANTILE_LEVELS), 1))
        self._one_step_scales: FloatArray = np.zeros(1)
        self._cusum_up = 0.0
        self._cusum_down = 0.0
        self._boost_left = 0
        # Samples `update` refused because they lay beyond the longest history it keeps.
        self.rejected_future = 0

    # ---- fitting -------------------------------------------------------------------------

    def fit(self, timestamps: ArrayLike, values: ArrayLike) -> None:
        config = self.config
        series = regularize(
            timestamps,
            values,
            default_interval_s=config.default_interval_s,
            max_points=None,
        )
        interval = series.interval_s
        limit = max(2, round(config.max_history_s / interval))
        raw = series.values[-limit:]
        observed_mask = np.isfinite(raw)
        filled = fill_gaps(raw)
        positive = filled[filled > 0]
        scale = float(np.median(positive)) if positive.shape[0] else 1.0
        self._offset = max(config.log_offset_fraction * scale, 1e-9)
        z = np.log(filled + self._offset)
        count = z.shape[0]

        self._interval = interval
        self._last_timestamp = series.last_timestamp
        self._last_index = count - 1
        self._max_steps = min(_MAX_STEPS, max(1, math.ceil(config.max_horizon_s / interval)))
        self._slow_rate = 1.0 - 0.5 ** (interval / config.slow_half_life_s)

        self.periods = self._detect(z, interval)
        self._profiles = []
        remainder = z.copy()
        remainder[~observed_mask] = np.nan
        for period in self.periods:
            cycles = (
                config.short_period_cycles
                if period * interval <= SECONDS_PER_DAY
                else config.long_period_cycles
            )
            anchor, shape = robust_profile(
                remainder, period, cycles=cycles, smoothing=config.profile_smoothing
            )
            self._profiles.append((period, anchor, shape))
            remainder = remainder - shape[(np.arange(count) - anchor) % period]
        seasonal = self._seasonal(np.arange(count))
        deseasonalised = fill_gaps(z - seasonal)
        self._choose_level(z, seasonal, deseasonalised, observed_mask)

    def _detect(self, z: FloatArray, interval: float) -> list[int]:
        found = detect_periods(
            z, interval, candidates_s=self.config.calendar_periods_s, min_acf=self.config.min_acf
        )
        if self.config.fft_periods:
            for period in dominant_fft_periods(
                z, max_periods=self.config.fft_periods, min_acf=self.config.min_acf
            ):
                if all(abs(period - known) > max(1, known // 10) for known in found):
                    found.append(period)
        return sorted(found)

    def _seasonal(self, indices: FloatArray | NDIntArray) -> FloatArray:
        total = np.zeros(np.shape(indices), dtype=np.float64)
        for period, anchor, shape in self._profiles:
            total += shape[(np.asarray(indices, dtype=np.int64) - anchor) % period]
        return total

    def _choose_level(
        self,
        z: FloatArray,
        seasonal: FloatArray,
        deseasonalised: FloatArray,
        observed_mask: NDBoolArray,
    ) -> None:
        config = self.config
        count = z.shape[0]
        slow = ewma(deseasonalised, self._slow_rate)
        window = min(count - 1, self._calibration_rows())
        steps = probe_steps(self._max_steps)
        origins = np.arange(count - window - 1, count - 1) if window > 0 else np.zeros(0, int)
        best: tuple[float, float, float] | None = None
        best_fast = slow
        for rate in config.level_rates:
            fast = ewma(deseasonalised, rate)
            for reversion in config.reversions:
                loss = level_loss(
                    z=z,
                    seasonal=seasonal,
                    fast=fast,
                    slow=slow,
                    observed_mask=observed_mask,
                    origins=origins,
                    steps=steps,
                    reversion=reversion,
                )
                if best is None or loss < best[0]:
                    best = (loss, rate, reversion)
                    best_fast = fast
        _, self._rate, self._reversion = best if best is not None else (0.0, 1.0, 1.0)
        keep = self._max_steps + 1
        self._fast_history = left_pad(best_fast[-keep:], keep)
        self._slow_history = left_pad(slow[-keep:], keep)
        errors, predicted = calibration_errors(
            z=z,
            seasonal=seasonal,
            fast=best_fast,
            slow=slow,
            observed_mask=observed_mask,
            reversion=self._reversion,
            max_steps=self._max_steps,
            window=self._calibration_rows(),
        )
        self._errors = ErrorRing(capacity=self._calibration_rows(), steps=self._max_steps)
        self._errors.extend(errors, predicted)
        self._recalibrate()
        self._fitted = True

    # ---- updating ------------------------------------------------------------------------

    def update(self, timestamps: ArrayLike, values: ArrayLike) -> None:
        if not self._fitted:
            self.fit(timestamps, values)
            return
        fresh = self._on_grid(timestamps, values)
        new_rows: list[FloatArray] = []
        new_predictions: list[FloatArray] = []
        for value in fresh:
            scored = self._advance(float(value))
            if scored is not None:
                new_rows.append(scored[0])
                new_predictions.append(scored[1])
        self._last_timestamp += fresh.shape[0] * self._interval
        if new_rows:
            self._errors.extend(np.asarray(new_rows), np.asarray(new_predictions))
            self._pending_rows += len(new_rows)
            if self._pending_rows >= max(
                _MIN_RECALIBRATE_ROWS, self.config.recalibrate_every_s / self._interval
            ):
                self._recalibrate()

    def _on_grid(self, timestamps: ArrayLike, values: ArrayLike) -> FloatArray:
        """The intervals after the last one seen, up to the newest sample (NaN where none)."""
        times = np.asarray(timestamps, dtype=np.float64).ravel()
        observed = np.asarray(values, dtype=np.float64).ravel()
        with np.errstate(invalid="ignore"):
            offsets = np.rint((times - self._last_timestamp) / self._interval)
        # A timestamp far in the future (a broken exporter clock) would allocate a grid up
        # to it and then make every later, correct sample look old: such samples are
        # rejected and counted, never applied. A real gap that long needs a refit anyway.
        too_far = offsets > self._max_gap_steps()
        if too_far.any():
            self.rejected_future += int(too_far.sum())
            log.warning(
                "%s: rejected %d sample(s) more than %.0f s after the last one (at %.0f s)",
                self.name,
                int(too_far.sum()),
                self._max_gap_steps() * self._interval,
                self._last_timestamp,
            )
        newer = np.isfinite(offsets) & (offsets > 0) & ~too_far
        if not newer.any():
            return np.zeros(0)
        steps = offsets.astype(np.int64)
        fresh = np.full(int(steps[newer].max()), np.nan)
        fresh[steps[newer] - 1] = observed[newer]
        return fresh

    def _advance(self, value: float) -> tuple[FloatArray, FloatArray] | None:
        """Move the levels one interval on; for an observed one, its errors at every step
        ahead and the forecasts they belong to (None for a missing one)."""
        self._last_index += 1
        seasonal_now = float(self._seasonal(np.array([self._last_index]))[0])
        fast, slow = self._fast_history[-1], self._slow_history[-1]
        scored = None
        if math.isfinite(value) and value >= 0:
            z_now = math.log(value + self._offset)
            # Forecasts made h steps ago for this interval, from the stored level history.
            steps = np.arange(1, self._max_steps + 1)
            past_fast = self._fast_history[-steps]
            past_slow = self._slow_history[-steps]
            predicted = seasonal_now + past_slow + self._reversion**steps * (past_fast - past_slow)
            scored = (z_now - predicted, predicted)
            self._track_quantiles(z_now - predicted, predicted)
            residual = z_now - seasonal_now
            rate = self._rate
            if self._boost_left > 0:
                rate = max(rate, _BOOSTED_RATE)
                self._boost_left -= 1
            fast += rate * (residual - fast)
            slow += self._slow_rate * (residual - slow)
            self._watch_for_shift(float(z_now - predicted[0]), predicted=float(predicted[0]))
        self._fast_history = np.append(self._fast_history[1:], fast)
        self._slow_history = np.append(self._slow_history[1:], slow)
        return scored

    def _max_gap_steps(self) -> int:
        return max(1, round(self.config.max_history_s / self._interval))

    def _track_quantiles(self, errors: FloatArray, predicted: FloatArray) -> None:
        """Quantile tracking: move each correction by rate * (miss - (1 - level))."""
        steps = np.arange(errors.shape[0])
        if self._corrections.shape[1] != steps.shape[0]:
            self._corrections = np.zeros((len(QUANTILE_LEVELS), steps.shape[0]))
        bins = np.searchsorted(self._bin_edges, predicted)
        # issued[level, step]: the quantile that was published for this interval.
        issued = self._spreads[bins, :, steps].T + self._corrections
        misses = (errors[None, :] > issued).astype(np.float64)
        scale = np.mean(self._spreads[:, -1, :] - self._spreads[:, 0, :], axis=0)
        rate = self.config.quantile_tracking_rate * np.maximum(scale, 1e-6)[None, :]
        targets = 1.0 - np.asarray(QUANTILE_LEVELS)[:, None]
        self._corrections = np.clip(
            self._corrections + rate * (misses - targets), -20 * rate, 20 * rate
        )

    def _calibration_rows(self) -> int:
        wanted = max(
            self.config.min_calibration_errors,
            round(self.config.calibration_window_s / self._interval),
        )
        # Fine grids (1 s) over long windows would hold millions of errors: cap the memory.
        return max(1, min(wanted, _MAX_CALIBRATION_CELLS // self._max_steps))

    def _watch_for_shift(self, surprise: float, *, predicted: float) -> None:
        """Two-sided CUSUM on one-step errors; an alarm speeds the fast level up for a while.

        A slow smoothing rate suits noisy series but would take hours to follow a launch-day
        surge. When one-step errors keep landing on the same side by more than `shift_slack`
        of their usual spread, the fast level switches to a quick rate for a few intervals
        (a "panic mode"), so the forecast catches up with a surge (or a drop) within minutes
        without jumping to any single noisy sample.
        """
        scale = float(self._one_step_scales[np.searchsorted(self._bin_edges, predicted)])
        if scale <= 0 or self.config.shift_threshold <= 0:
            return
        standardised = surprise / scale
        slack = self.config.shift_slack
        self._cusum_up = max(0.0, self._cusum_up + standardised - slack)
        self._cusum_down = max(0.0, self._cusum_down - standardised - slack)
        if max(self._cusum_up, self._cusum_down) >= self.config.shift_threshold:
            self._cusum_up = self._cusum_down = 0.0
            self._boost_left = _BOOST_STEPS

    def _recalibrate(self) -> None:
        self._pending_rows = 0
        self._bin_edges, self._spreads = spread_by_step(
            self._errors.errors,
            self._errors.predicted,
            self._max_steps,
            bins=self.config.level_bins,
        )
        # Spread of one-step errors in standard-deviation units (q0.95 - q0.5 = 1.645 sd).
        # per forecast-level bin, since a quiet night is noisier (in log space) than a peak.
        scales = (self._spreads[:, 2, 0] - self._spreads[:, 0, 0]) / 1.645
        self._one_step_scales = np.where(np.isfinite(scales), scales, 0.0)

    # ---- predicting ----------------------------------------------------------------------

    def predict(self, horizon_steps: int) -> Forecast:
        if not self._fitted:
            raise RuntimeError("predict() before fit()")
        steps = np.arange(1, horizon_steps + 1)
        fast, slow = self._fast_history[-1], self._slow_history[-1]
        z_hat = (
            self._seasonal(self._last_index + steps)
            + slow
            + self._reversion ** steps.astype(np.float64) * (fast - slow)
        )
        columns = np.minimum(steps, self._max_steps) - 1
        bins = np.searchsorted(self._bin_edges, z_hat)
        spreads = self._spreads[bins, :, columns]
        if self._corrections.shape[1] == self._max_steps:
            spreads = spreads + self._corrections[:, columns].T
        quantiles = {
            level: np.exp(z_hat + spreads[:, index]) - self._offset
            for index, level in enumerate(QUANTILE_LEVELS)
        }
        return make_forecast(
            last_timestamp=self._last_timestamp,
            interval_s=self._interval,
            point=quantiles[0.5],
            quantiles=quantiles,
        )


# After a shift alarm, the fast level moves at least this fast for this many intervals.
_BOOSTED_RATE = 0.3
_BOOST_STEPS = 10

# Steps ahead with their own calibration; beyond, the last one's spread holds.
_MAX_STEPS = 720
# Errors kept for calibration, over all steps ahead (8 bytes each, twice).
_MAX_CALIBRATION_CELLS = 2_000_000

# Recalibrating costs a few milliseconds: on coarse series, batch at least this many rows.
_MIN_RECALIBRATE_ROWS = 6
