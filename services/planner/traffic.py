"""Serving demand as pure functions of time: rate(t) in requests/s. No I/O.

Profiles are defined for every t (also before the simulation starts), so a forecaster can
be fitted on the "history" that precedes t = 0.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import numpy.typing as npt

FloatArray = npt.NDArray[np.float64]


@dataclass(frozen=True)
class ConstantProfile:
    rps: float

    def rate(self, t: float) -> float:
        return self.rps


@dataclass(frozen=True)
class PointsProfile:
    """Piecewise constant (`step`) or linear between (time, rate) points, optionally periodic."""

    times: tuple[float, ...]
    rates: tuple[float, ...]
    linear: bool = False
    repeat_s: float | None = None

    def rate(self, t: float) -> float:
        if self.repeat_s:
            t = self.times[0] + (t - self.times[0]) % self.repeat_s
        if t <= self.times[0]:
            return self.rates[0]
        if t >= self.times[-1]:
            return self.rates[-1]
        if self.linear:
            return float(np.interp(t, self.times, self.rates))
        return self.rates[bisect.bisect_right(self.times, t) - 1]


@dataclass(frozen=True)
class DiurnalProfile:
    """A cosine day: `peak_rps` at `peak_at_s` (seconds into the period), `base_rps` 12 h off.

    `noise` adds deterministic pseudo-random jitter (a fraction of the rate), changing every
    `noise_step_s`, reproducible from `seed`.
    """

    base_rps: float
    peak_rps: float
    period_s: float = 86_400.0
    peak_at_s: float = 14 * 3600.0
    noise: float = 0.0
    noise_step_s: float = 60.0
    seed: int = 0

    def rate(self, t: float) -> float:
        phase = 2 * math.pi * (t - self.peak_at_s) / self.period_s
        middle = (self.peak_rps + self.base_rps) / 2
        amplitude = (self.peak_rps - self.base_rps) / 2
        value = middle + amplitude * math.cos(phase)
        if self.noise:
            value *= 1.0 + self.noise * _jitter(self.seed, math.floor(t / self.noise_step_s))
        return max(value, 0.0)


def _jitter(seed: int, bucket: int) -> float:
    """A reproducible value in [-1, 1] for (seed, bucket), without global random state."""
    mixed = (bucket * 0x9E3779B1 + seed * 0x85EBCA77) & 0xFFFFFFFF
    mixed ^= mixed >> 15
    mixed = (mixed * 0x2C1B3C6D) & 0xFFFFFFFF
    mixed ^= mixed >> 12
    return (mixed / 0xFFFFFFFF) * 2.0 - 1.0


@dataclass(frozen=True)
class TraceProfile:
    """A request-count trace replayed as a rate.

    Row i covers [timestamps[i], timestamps[i] + interval) in trace time and holds a count.
    Simulation time t maps to trace time `start_s + t / time_scale`; the rate is the count per
    interval divided by the interval in simulation seconds, times `amplitude`. Outside the
    trace the first/last rows hold.
    """

    timestamps: tuple[float, ...]
    counts: tuple[float, ...]
    interval_s: float
    start_s: float = 0.0
    time_scale: float = 1.0  # trace seconds per simulated second (10 = ten times faster)
    amplitude: float = 1.0

    def rate(self, t: float) -> float:
        trace_t = self.start_s + t * self.time_scale
        index = bisect.bisect_right(self.timestamps, trace_t) - 1
        index = min(max(index, 0), len(self.counts) - 1)
        per_sim_second = self.counts[index] / (self.interval_s / self.time_scale)
        return per_sim_second * self.amplitude


class RateProfile(Protocol):
    def rate(self, t: float) -> float: ...


def sample(profile: RateProfile, times: Sequence[float]) -> FloatArray:
    return np.array([profile.rate(t) for t in times], dtype=np.float64)
