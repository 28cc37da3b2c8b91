"""The forecaster contract and the series helpers every model shares.

Times are seconds (floats) passed in by the caller; nothing here reads a clock. Values are
whatever the caller measures per regular interval (a count per interval or a rate); forecasts
come back in the same unit.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np
from numpy.typing import ArrayLike, NDArray

FloatArray = NDArray[np.float64]
# Calibration windows keep days of log errors per step ahead, the bulk of a forecast
# workload's memory; float32's 7 digits are far finer than any error's noise.
StoredArray = NDArray[np.float32]

SECONDS_PER_DAY = 86_400.0
SECONDS_PER_WEEK = 7 * SECONDS_PER_DAY


@dataclass(frozen=True)
class Forecast:
    """Per-step forecast over a horizon.

    `timestamps[i]` is the start of the i-th forecast interval (same convention as the input:
    a value covers [t, t + interval)). Quantiles are monotone in the level and non-negative.
    """

    timestamps: FloatArray
    point: FloatArray
    quantiles: Mapping[float, FloatArray]
    interval_s: float

    def quantile(self, level: float) -> FloatArray:
        return self.quantiles[level]

    @property
    def horizon_steps(self) -> int:
        return int(self.point.shape[0])


def make_forecast(
    *,
    last_timestamp: float,
    interval_s: float,
    point: ArrayLike,
    quantiles: Mapping[float, ArrayLike],
) -> Forecast:
    """Assemble a Forecast, enforcing the invariants every consumer relies on.

    Non-finite values become 0, negatives are clipped to 0, and quantiles are made monotone
    in their level with a running maximum so a model's numeric noise can never make
    q0.99 < q0.95.
    """
    point_array = np.nan_to_num(np.asarray(point, dtype=np.float64), nan=0.0, posinf=0.0)
    point_array = np.maximum(point_array, 0.0)
    steps = point_array.shape[0]
    levels = sorted(quantiles)
    running = np.zeros(steps, dtype=np.float64)
    ordered: dict[float, FloatArray] = {}
    for index, level in enumerate(levels):
        values = np.asarray(quantiles[level], dtype=np.float64)
        values = np.nan_to_num(values, nan=0.0, posinf=float(np.finfo(np.float64).max))
        values = np.maximum(values, 0.0)
        running = values if index == 0 else np.maximum(running, values)
        ordered[level] = running.copy()
    timestamps = last_timestamp + interval_s * np.arange(1, steps + 1, dtype=np.float64)
    return Forecast(
        timestamps=timestamps, point=point_array, quantiles=ordered, interval_s=interval_s
    )


class Forecaster(Protocol):
    """A forecasting model.

    `fit` estimates parameters from a whole history (expensive, done at the refit cadence);
    `update` conditions the fitted model on observations that arrived since (cheap, done
    every step, parameters unchanged); `predict` forecasts the next `horizon_steps` intervals
    after the last observation seen.
    """

    name: str

    def fit(self, timestamps: ArrayLike, values: ArrayLike) -> None: ...

    def update(self, timestamps: ArrayLike, values: ArrayLike) -> None: ...

    def predict(self, horizon_steps: int) -> Forecast: ...


@dataclass(frozen=True)
class RegularSeries:
    """A series on a regular grid; NaN marks a missing interval."""

    start_s: float
    interval_s: float
    values: FloatArray

    @property
    def last_timestamp(self) -> float:
        return self.start_s + self.interval_s * (len(self.values) - 1)

    def tail(self, points: int) -> RegularSeries:
        """The last `points` intervals (at least one), with the start moved accordingly."""
        kept = self.values[-max(1, points) :]
        start = self.last_timestamp - self.interval_s * (kept.shape[0] - 1)
        return RegularSeries(start_s=start, interval_s=self.interval_s, values=kept)


def infer_interval(timestamps: FloatArray, default_interval_s: float) -> float:
    if timestamps.shape[0] < 2:
        return default_interval_s
    steps = np.diff(timestamps)
    steps = steps[steps > 0]
    if steps.shape[0] == 0:
        return default_interval_s
    return float(np.median(steps))


def regularize(
    timestamps: ArrayLike,
    values: ArrayLike,
    *,
    default_interval_s: float,
    interval_s: float | None = None,
    max_points: int | None = None,
) -> RegularSeries:
    """Place observations on a regular grid (gaps become NaN, duplicates keep the last).

    Raises ValueError on empty input or mismatched lengths: a model cannot be fitted on
    nothing, and the caller must know.
    """
    times = np.asarray(timestamps, dtype=np.float64).ravel()
    observed = np.asarray(values, dtype=np.float64).ravel()
    if times.shape != observed.shape:
        raise ValueError(f"timestamps ({times.shape[0]}) and values ({observed.shape[0]}) differ")
    keep = np.isfinite(times)
    times, observed = times[keep], observed[keep]
    if times.shape[0] == 0:
        raise ValueError("cannot fit a forecaster on an empty history")
    order = np.argsort(times, kind="stable")
    times, observed = times[order], observed[order]
    step = interval_s if interval_s is not None else infer_interval(times, default_interval_s)
    observed = np.where(observed < 0, np.nan, observed)
    index = np.rint((times - times[-1]) / step).astype(np.int64)
    index -= index[0]
    length = int(index[-1]) + 1
    grid = np.full(length, np.nan, dtype=np.float64)
    grid[index] = observed
    start = float(times[-1] - step * (length - 1))
    if max_points is not None and length > max_points:
        start += step * (length - max_points)
        grid = grid[-max_points:]
    return RegularSeries(start_s=start, interval_s=step, values=grid)


def fill_gaps(values: FloatArray) -> FloatArray:
    """Linear interpolation over NaN runs; edges take the nearest observed value."""
    missing = ~np.isfinite(values)
    if not missing.any():
        return values
    if missing.all():
        return np.zeros_like(values)
    positions = np.arange(values.shape[0])
    filled = values.copy()
    filled[missing] = np.interp(positions[missing], positions[~missing], values[~missing])
    return filled


def autocorrelation(values: FloatArray, max_lag: int) -> FloatArray:
    """Sample autocorrelation up to `max_lag` (inclusive), by FFT, after linear detrending.

    A constant series has no defined autocorrelation: it returns zeros, so no period is
    ever detected on it.
    """
    series = fill_gaps(values)
    length = series.shape[0]
    if length < 3:
        return np.zeros(max_lag + 1, dtype=np.float64)
    positions = np.arange(length, dtype=np.float64)
    slope, intercept = np.polyfit(positions, series, 1)
    centred = series - (slope * positions + intercept)
    variance = float(np.dot(centred, centred))
    if variance <= 1e-12 * max(1.0, float(np.dot(series, series))):
        return np.zeros(max_lag + 1, dtype=np.float64)
    size = 1 << int(2 * length - 1).bit_length()
    spectrum = np.fft.rfft(centred, n=size)
    correlation = np.fft.irfft(spectrum * np.conj(spectrum), n=size)[: max_lag + 1]
    result: FloatArray = correlation / variance
    if result.shape[0] < max_lag + 1:
        result = np.concatenate([result, np.zeros(max_lag + 1 - result.shape[0])])
    return result


def confirm_period(acf: FloatArray, period_steps: int, *, min_acf: float) -> float | None:
    """ACF strength at a candidate period, or None when the period is not confirmed.

    Confirmed means: the ACF peaks near the lag (within 10 %), is at least `min_acf` there,
    and rises clearly above its trough between half a period either side, which rejects the
    slowly decaying ACF of a trend.
    """
    if period_steps < 2 or period_steps >= acf.shape[0]:
        return None
    slack = max(1, period_steps // 10)
    low = max(1, period_steps - slack)
    high = min(acf.shape[0] - 1, period_steps + slack)
    peak = float(np.max(acf[low : high + 1]))
    if peak < min_acf:
        return None
    trough = float(np.min(acf[max(1, period_steps // 4) : max(2, (3 * period_steps) // 4) + 1]))
    if peak - trough < 0.2:
        return None
    return peak


def detect_periods(
    values: FloatArray,
    interval_s: float,
    *,
    candidates_s: Sequence[float],
    min_acf: float = 0.3,
    min_cycles: float = 2.0,
) -> list[int]:
    """Periods (in steps) among the candidates that the data confirms, shortest first.

    A candidate needs `min_cycles` full cycles of history and a confirmed ACF peak.
    """
    length = values.shape[0]
    periods: list[int] = []
    usable = [
        round(candidate / interval_s)
        for candidate in candidates_s
        if candidate / interval_s >= 2 and length >= min_cycles * candidate / interval_s
    ]
    if not usable:
        return periods
    longest = max(usable)
    acf = autocorrelation(values, 2 * longest)
    for period in sorted(set(usable)):
        if confirm_period(acf, period, min_acf=min_acf) is not None and adds_to(
            acf, period, periods
        ):
            periods.append(period)
    return periods


def adds_to(acf: FloatArray, period: int, accepted: Sequence[int]) -> bool:
    """Whether `period` says more than the shorter periods it is a multiple of.

    A pure daily cycle also correlates at 7 days; a weekly pattern shows as the 7-day lag
    correlating more than the 6- and 8-day lags, which a daily cycle alone cannot do.
    """
    for base in accepted:
        multiple = round(period / base)
        if multiple < 2 or abs(period - multiple * base) > max(1, base // 10):
            continue
        here = _peak_near(acf, period)
        neighbours = [_peak_near(acf, period - base), _peak_near(acf, period + base)]
        if any(
            value is not None and here is not None and here <= value + 0.01 for value in neighbours
        ):
            return False
    return True


def _peak_near(acf: FloatArray, lag: int) -> float | None:
    slack = max(1, lag // 20)
    if lag - slack < 1 or lag + slack >= acf.shape[0]:
        return None
    return float(np.max(acf[lag - slack : lag + slack + 1]))


def dominant_fft_periods(
    values: FloatArray,
    *,
    max_periods: int,
    min_acf: float = 0.3,
    min_cycles: float = 2.0,
    snap_to: Sequence[int] = (),
) -> list[int]:
    """Periods (in steps) of the strongest spectral peaks that the ACF confirms.

    The FFT proposes candidate frequencies; a candidate is kept only if the autocorrelation
    also peaks at that lag, since a periodogram alone also lights up for trends and bursts.
    """
    series = fill_gaps(values)
    length = series.shape[0]
    if length < 8:
        return []
    positions = np.arange(length, dtype=np.float64)
    slope, intercept = np.polyfit(positions, series, 1)
    centred = series - (slope * positions + intercept)
    power = np.abs(np.fft.rfft(centred)) ** 2
    frequencies = np.fft.rfftfreq(length)
    valid = (frequencies > 0) & (frequencies * length >= min_cycles)
    valid &= frequencies <= 0.25
    if not valid.any():
        return []
    candidate_index = np.flatnonzero(valid)
    strongest = candidate_index[np.argsort(power[candidate_index])[::-1][: 4 * max_periods]]
    longest = int(length / min_cycles)
    acf = autocorrelation(values, 2 * longest + 2)
    accepted: list[int] = []
    for index in strongest:
        period = round(1.0 / float(frequencies[index]))
        if period > longest:
            continue
        # Spectral bins are coarse at long periods (a 1440-step day shows up as 1260 or
        # 1680 in a week of data): move to the autocorrelation's peak nearby.
        low, high = max(2, int(period * 0.8)), min(longest, int(period * 1.2) + 1)
        if high <= low:
            continue
        period = low + int(np.argmax(acf[low : high + 1]))
        multiples = [known * round(period / known) for known in accepted if period > known]
        for preferred in [*snap_to, *multiples]:
            # Noise moves a broad ACF peak by a few percent; a calendar period that close
            # is the better explanation.
            if abs(period - preferred) <= 0.03 * preferred:
                period = preferred
        if any(abs(period - known) <= max(1, known // 5) for known in accepted):
            continue
        if confirm_period(acf, period, min_acf=min_acf) is not None and adds_to(
            acf, period, sorted(accepted)
        ):
            accepted.append(period)
        if len(accepted) >= max_periods:
            break
    return sorted(accepted)


def empirical_quantiles(errors: FloatArray, levels: Sequence[float]) -> FloatArray:
    """Quantiles of forecast errors per horizon step: rows = levels, columns = steps.

    `errors` has one row per origin and one column per step; NaN entries are ignored. Steps
    with no error sample get 0 (no spread known yet).
    """
    result = np.zeros((len(levels), errors.shape[1]), dtype=np.float64)
    if errors.shape[0] == 0:
        return result
    counts = np.sum(np.isfinite(errors), axis=0)
    for step in range(errors.shape[1]):
        if counts[step] == 0:
            continue
        column = errors[:, step]
        result[:, step] = np.quantile(column[np.isfinite(column)], levels)
    return result


def extend_series(
    series: RegularSeries,
    timestamps: ArrayLike,
    values: ArrayLike,
    *,
    max_points: int,
) -> tuple[RegularSeries, int]:
    """Append observations newer than the series' last one (older ones are ignored).

    Returns the new series (trimmed to `max_points`) and how many grid steps were added;
    skipped intervals become NaN.
    """
    times = np.asarray(timestamps, dtype=np.float64).ravel()
    observed = np.asarray(values, dtype=np.float64).ravel()
    if times.shape != observed.shape:
        raise ValueError(f"timestamps ({times.shape[0]}) and values ({observed.shape[0]}) differ")
    offsets = np.rint((times - series.last_timestamp) / series.interval_s).astype(np.int64)
    newer = (offsets > 0) & np.isfinite(times)
    if not newer.any():
        return series, 0
    offsets, observed = offsets[newer], observed[newer]
    added = int(offsets.max())
    tail = np.full(added, np.nan, dtype=np.float64)
    tail[offsets - 1] = np.where(observed < 0, np.nan, observed)
    grid = np.concatenate([series.values, tail])
    start = series.start_s
    if grid.shape[0] > max_points:
        start += series.interval_s * (grid.shape[0] - max_points)
        grid = grid[-max_points:]
    return RegularSeries(start_s=start, interval_s=series.interval_s, values=grid), added
