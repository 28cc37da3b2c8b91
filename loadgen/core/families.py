"""Synthetic traffic families: seeded request-count series of shapes nobody tuned for.

Each family draws its own parameters (levels, peak hours, ratios, event sizes and times)
from the seed, so a family with many seeds is a population of workloads rather than one
curve; forecasters and policies are judged on the spread over seeds. Pure: numpy only, no
clock, no files; the same (family, seed, length, interval) always gives the same counts.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray
from scipy.signal import lfilter

from tideshift.loadgen.core.profiles import DAY_S, HOUR_S, WEEK_S

FloatArray = NDArray[np.float64]


@dataclass(frozen=True)
class FamilySeries:
    """Counts per interval; row i covers [timestamps[i], timestamps[i] + interval_s)."""

    family: str
    seed: int
    interval_s: float
    timestamps: FloatArray
    counts: FloatArray


def _span(t: FloatArray) -> float:
    """The seconds the series' times cover; a day for a single point (the events' scale)."""
    return float(t[-1] - t[0]) if t.shape[0] > 1 else DAY_S


def _daily_shape(
    t: FloatArray, rng: np.random.Generator, *, ratio: tuple[float, float]
) -> FloatArray:
    """A day curve with a random peak hour and peak/trough ratio, mean about 1."""
    peak_hour = rng.uniform(9.0, 21.0)
    peak_to_trough = rng.uniform(*ratio)
    phase = 2 * np.pi * (t / DAY_S - peak_hour / 24.0)
    # A sharpened cosine: peaks narrower than troughs, as on most request traces.
    wave = (1 + np.cos(phase)) / 2
    wave = wave ** rng.uniform(1.0, 2.5)
    shape = 1.0 + (peak_to_trough - 1.0) * wave
    return shape / float(np.mean(shape))


def _weekly_factor(t: FloatArray, rng: np.random.Generator) -> FloatArray:
    """Two consecutive quiet days a week (the weekend), starting on a random day."""
    dip = rng.uniform(0.5, 0.85)
    first_quiet_day = int(rng.integers(0, 7))
    day_of_week = np.floor(t / DAY_S).astype(np.int64) % 7
    quiet = (day_of_week == first_quiet_day) | (day_of_week == (first_quiet_day + 1) % 7)
    return np.where(quiet, dip, 1.0)


def _drift(t: FloatArray, rng: np.random.Generator) -> FloatArray:
    """Slow growth or decline: up to +-40 % a week, compounded."""
    weekly = rng.uniform(-0.4, 0.4)
    result: FloatArray = np.exp(np.log1p(weekly) * t / WEEK_S)
    return result


def _daily_drift(t: FloatArray, rng: np.random.Generator) -> FloatArray:
    return _daily_shape(t, rng, ratio=(2.0, 6.0)) * _drift(t, rng)


def _weekly(t: FloatArray, rng: np.random.Generator) -> FloatArray:
    return _daily_shape(t, rng, ratio=(1.5, 4.0)) * _weekly_factor(t, rng) * _drift(t, rng)


def _flash_crowds(t: FloatArray, rng: np.random.Generator) -> FloatArray:
    """A mild day curve plus surges of random size (2-10x) at random times."""
    rate = _daily_shape(t, rng, ratio=(1.3, 3.0))
    span = _span(t)
    count = int(rng.poisson(1.2 * span / DAY_S))
    for _ in range(count):
        start = t[0] + rng.uniform(0, span)
        size = rng.uniform(1.0, 9.0)  # extra demand at the crest, in units of the mean
        rise_s = rng.uniform(60.0, 900.0)
        half_life_s = rng.uniform(600.0, 3 * HOUR_S)
        after = t - start
        ramp = np.clip(after / rise_s, 0.0, 1.0)
        decay = np.exp2(-np.maximum(after - rise_s, 0.0) / half_life_s)
        rate = rate + size * ramp * decay
    return rate


def _bursty(t: FloatArray, rng: np.random.Generator) -> FloatArray:
    """A weak day curve times log-normal bursts that persist for a few intervals."""
    base = _daily_shape(t, rng, ratio=(1.2, 2.5))
    persistence = rng.uniform(0.5, 0.9)
    sigma = rng.uniform(0.3, 0.8)
    shocks = np.asarray(
        rng.normal(0.0, sigma * math.sqrt(1 - persistence**2), t.shape[0]), dtype=np.float64
    )
    # AR(1) in log space: a burst lasts a few intervals, as real bursts do.
    log_burst = np.asarray(lfilter([1.0], [1.0, -persistence], shocks), dtype=np.float64)
    result: FloatArray = base * np.exp(log_burst - sigma**2 / 2)
    return result


def _level_shifts(t: FloatArray, rng: np.random.Generator) -> FloatArray:
    """A day curve whose level steps up or down (by 0.5x-2x) at random times."""
    rate = _daily_shape(t, rng, ratio=(1.5, 4.0))
    span = _span(t)
    for _ in range(int(rng.poisson(0.4 * span / DAY_S))):
        at = t[0] + rng.uniform(0, span)
        rate = rate * np.where(t >= at, math.exp(rng.uniform(-0.7, 0.7)), 1.0)
    return rate


def _holidays(t: FloatArray, rng: np.random.Generator) -> FloatArray:
    """A weekly pattern with whole days (about one in ten) at 30-70 % of their usual level."""
    rate = _weekly(t, rng)
    day = np.floor((t - t[0]) / DAY_S).astype(np.int64)
    days = int(day[-1]) + 1 if day.shape[0] else 0
    holiday_level = np.where(
        rng.random(days) < 0.1, np.asarray(rng.uniform(0.3, 0.7, days), dtype=np.float64), 1.0
    )
    result: FloatArray = rate * holiday_level[day]
    return result


def _periodic_spikes(t: FloatArray, rng: np.random.Generator) -> FloatArray:
    """A mild day curve plus spikes of a few minutes at 3-6x the base, every 1-3 h.

    The period is drawn once per member; each spike's start is jittered by up to a tenth of
    the period and its height by the height range, so the spikes come back on a schedule a
    forecaster can learn, but never exactly.
    """
    rate = _daily_shape(t, rng, ratio=(1.2, 2.0))
    period_s = rng.uniform(HOUR_S, 3 * HOUR_S)
    span = _span(t)
    first = t[0] + rng.uniform(0.0, period_s)
    for nominal in np.arange(first, t[0] + span + period_s, period_s):
        start = nominal + rng.uniform(-0.1, 0.1) * period_s
        height = rng.uniform(3.0, 6.0)  # the spike's rate over the base at that time
        length_s = rng.uniform(120.0, 600.0)
        inside = (t >= start) & (t < start + length_s)
        rate = np.where(inside, rate * height, rate)
    return rate


def _steep_daily(t: FloatArray, rng: np.random.Generator) -> FloatArray:
    """A narrow daily peak (8-20x the trough) under multiplicative log-normal noise."""
    peak_hour = rng.uniform(9.0, 21.0)
    width_h = rng.uniform(0.75, 2.0)
    # Hours from the peak, wrapped to [-12, 12): a Gaussian bump per day.
    offset = ((t / HOUR_S - peak_hour + 12.0) % 24.0) - 12.0
    shape = 1.0 + (rng.uniform(8.0, 20.0) - 1.0) * np.exp(-0.5 * (offset / width_h) ** 2)
    sigma = rng.uniform(0.15, 0.4)
    noise = np.exp(rng.normal(-(sigma**2) / 2, sigma, t.shape[0]))
    result: FloatArray = shape / float(np.mean(shape)) * noise
    return result


def _jittered_spikes(t: FloatArray, rng: np.random.Generator) -> FloatArray:
    """A mild day curve plus short spikes (3-8x) at Poisson times: no schedule to learn."""
    rate = _daily_shape(t, rng, ratio=(1.2, 2.0))
    span = _span(t)
    for _ in range(int(rng.poisson(rng.uniform(8.0, 20.0) * span / DAY_S))):
        start = t[0] + rng.uniform(0.0, span)
        inside = (t >= start) & (t < start + rng.uniform(60.0, 900.0))
        rate = np.where(inside, rate * rng.uniform(3.0, 8.0), rate)
    return rate


def _drifting_schedule(t: FloatArray, rng: np.random.Generator) -> FloatArray:
    """Spikes on a schedule whose period drifts (each gap 0.85-1.15x the last, within
    1-4 h): a recurrence fitted on the past lands further off each time."""
    rate = _daily_shape(t, rng, ratio=(1.2, 2.0))
    span = _span(t)
    period = rng.uniform(HOUR_S, 3 * HOUR_S)
    start = t[0] + rng.uniform(0.0, period)
    while start < t[0] + span:
        inside = (t >= start) & (t < start + rng.uniform(120.0, 600.0))
        rate = np.where(inside, rate * rng.uniform(3.0, 6.0), rate)
        period = float(np.clip(period * rng.uniform(0.85, 1.15), HOUR_S, 4 * HOUR_S))
        start += period
    return rate


def _noise_bursts(t: FloatArray, rng: np.random.Generator) -> FloatArray:
    """A day curve, calm most of the time, with episodes of 20-90 min of heavy noise
    (log-normal, sigma 0.5-1) a few times a day."""
    rate = _daily_shape(t, rng, ratio=(1.5, 3.0))
    span = _span(t)
    sigma = np.zeros(t.shape[0])
    for _ in range(int(rng.poisson(4.0 * span / DAY_S))):
        start = t[0] + rng.uniform(0.0, span)
        inside = (t >= start) & (t < start + rng.uniform(1200.0, 5400.0))
        sigma = np.where(inside, rng.uniform(0.5, 1.0), sigma)
    noise = np.exp(rng.normal(0.0, 1.0, t.shape[0]) * sigma - sigma**2 / 2)
    result: FloatArray = rate * noise
    return result


def _step_changes(t: FloatArray, rng: np.random.Generator) -> FloatArray:
    """A flat level that steps (0.4x-2.5x) a few times a day, with no daily cycle."""
    rate = np.ones(t.shape[0])
    span = _span(t)
    for _ in range(int(rng.poisson(3.0 * span / DAY_S))):
        at = t[0] + rng.uniform(0.0, span)
        rate = rate * np.where(t >= at, math.exp(rng.uniform(-0.9, 0.9)), 1.0)
    result: FloatArray = rate / float(np.mean(rate))
    return result


def _missing_data(t: FloatArray, rng: np.random.Generator) -> FloatArray:
    """A daily curve with gaps of 10-120 min at zero, a few a day: a collector outage as a
    counting trace records it (no rows counted; NASA's log ends that way), so the planner
    sees demand vanish and come back at its level."""
    rate = _daily_shape(t, rng, ratio=(2.0, 5.0))
    span = _span(t)
    for _ in range(int(rng.poisson(2.0 * span / DAY_S))):
        start = t[0] + rng.uniform(0.0, span)
        rate = np.where((t >= start) & (t < start + rng.uniform(600.0, 7200.0)), 0.0, rate)
    return rate


@dataclass(frozen=True)
class _Family:
    shape: Callable[[FloatArray, np.random.Generator], FloatArray]
    # Mean requests per minute is drawn log-uniformly from this range.
    per_minute: tuple[float, float]
    # Extra-Poisson noise: the count is Poisson(rate * Gamma(k, 1/k)); None = plain Poisson.
    gamma_shape: float | None
    summary: str
    # Whether Tideshift's serving rules were tuned on this family's scenarios (issue 26's
    # shipped families) or it is held out, for out-of-sample evaluation only (issue 39).
    tuned: bool = False


FAMILIES: dict[str, _Family] = {
    "daily_drift": _Family(_daily_drift, (200, 5000), None, "daily cycle, growth or decline"),
    "weekly": _Family(_weekly, (200, 5000), None, "daily and weekly cycles with drift"),
    "flash_crowds": _Family(
        _flash_crowds, (100, 2000), None, "surges of random size and time", tuned=True
    ),
    "bursty_low": _Family(_bursty, (1, 10), 2.0, "bursty noise at a few requests a minute"),
    "bursty_high": _Family(_bursty, (5000, 50000), 20.0, "bursty noise at high counts"),
    "level_shifts": _Family(_level_shifts, (200, 5000), None, "the level steps up or down"),
    "holidays": _Family(_holidays, (200, 5000), None, "weekly cycle with quiet holidays"),
    "periodic_spikes": _Family(
        _periodic_spikes,
        (100, 2000),
        None,
        "spikes of a few minutes at 3-6x every 1-3 h",
        tuned=True,
    ),
    "steep_daily": _Family(
        _steep_daily, (200, 5000), None, "noisy, with a steep daily peak", tuned=True
    ),
    "jittered_spikes": _Family(
        _jittered_spikes, (100, 2000), None, "short 3-8x spikes at random times, no schedule"
    ),
    "drifting_schedule": _Family(
        _drifting_schedule, (100, 2000), None, "spikes on a schedule whose period drifts"
    ),
    "noise_bursts": _Family(
        _noise_bursts, (200, 5000), None, "calm day curve with episodes of heavy noise"
    ),
    "step_changes": _Family(
        _step_changes, (200, 5000), None, "flat level stepping 0.4-2.5x, no daily cycle"
    ),
    "missing_data": _Family(
        _missing_data, (200, 5000), None, "daily curve with gaps of zero counts (outages)"
    ),
}


def held_out() -> list[str]:
    """The families no serving rule was tuned on (out-of-sample evaluation)."""
    return [name for name, family in FAMILIES.items() if not family.tuned]


def family_names() -> list[str]:
    return list(FAMILIES)


def generate(family: str, *, seed: int, duration_s: float, interval_s: float) -> FamilySeries:
    """Counts per `interval_s` over `duration_s` for one member of a family.

    Raises ValueError naming the argument on an unknown family or a non-positive length.
    """
    if family not in FAMILIES:
        raise ValueError(f"family: unknown {family!r}; expected one of {', '.join(FAMILIES)}")
    if not interval_s > 0:
        raise ValueError(f"interval_s: expected > 0, got {interval_s!r}")
    if not duration_s >= interval_s:
        raise ValueError(f"duration_s: expected >= interval_s ({interval_s:g}), got {duration_s!r}")
    spec = FAMILIES[family]
    # One stream per (family, seed): the same seed in two families gives unrelated series.
    rng = np.random.default_rng([seed, list(FAMILIES).index(family)])
    timestamps = np.arange(0.0, duration_s, interval_s)
    low, high = spec.per_minute
    per_interval = math.exp(rng.uniform(math.log(low), math.log(high))) * interval_s / 60.0
    rate = per_interval * spec.shape(timestamps + interval_s / 2, rng)
    if spec.gamma_shape is not None:
        rate = rate * rng.gamma(spec.gamma_shape, 1.0 / spec.gamma_shape, rate.shape[0])
    counts = rng.poisson(np.maximum(rate, 0.0)).astype(np.float64)
    return FamilySeries(family, seed, interval_s, timestamps, counts)


def to_csv(series: FamilySeries) -> str:
    """The series as a `timestamp_s,requests` trace (the format backtest and simulate read)."""
    rows = [
        f"{timestamp:g},{count:g}"
        for timestamp, count in zip(series.timestamps, series.counts, strict=True)
    ]
    return "timestamp_s,requests\n" + "\n".join(rows) + "\n"
