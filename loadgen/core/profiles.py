"""Traffic profiles: the request rate as a pure function of profile time, rate(t) in requests/s.

No I/O, no clock: the driver (or the demo, or a test) passes the time in. Profile time starts at
0 at the beginning of a run; `t` may also be negative (history before the run) and every profile
is defined there too.

Shapes:
* `ConstantProfile`: one rate.
* `PointsProfile`: (time, rate) points, stepped or linear between them, optionally periodic.
* `DiurnalProfile`: a synthetic day (trough at night, peak in the afternoon), optionally a
  weekend dip, reproducible noise and surges.
* `TraceProfile`: a recorded request-count trace (`timestamp_s,requests` rows, read by
  `tideshift.loadgen.traces`) replayed as a rate, compressed in time and scaled in amplitude.
"""

from __future__ import annotations

import bisect
import itertools
import math
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

# loadgen imports no service, so the units of time are declared here again, with the same
# values as services/core/constants.py (tests/unit/loadgen checks they agree).
HOUR_S = 3_600.0
DAY_S = 24 * HOUR_S
WEEK_S = 7 * DAY_S


class RateProfile(Protocol):
    def rate(self, t: float) -> float:
        """Requests per second at profile time `t` (seconds); never negative."""
        ...


@dataclass(frozen=True)
class ConstantProfile:
    rps: float

    def __post_init__(self) -> None:
        if not self.rps >= 0:
            raise ValueError(f"rps must be >= 0, got {self.rps!r}")

    def rate(self, t: float) -> float:
        return self.rps


@dataclass(frozen=True)
class PointsProfile:
    """Piecewise constant (`linear=False`) or linear between (time, rate) points.

    Before the first point and after the last the end rates hold; with `repeat_s` the points
    repeat with that period from the first point's time.
    """

    times: tuple[float, ...]
    rates: tuple[float, ...]
    linear: bool = False
    repeat_s: float | None = None

    def __post_init__(self) -> None:
        if len(self.times) != len(self.rates) or not self.times:
            raise ValueError("points need as many times as rates, at least one")
        if any(b <= a for a, b in itertools.pairwise(self.times)):
            raise ValueError("point times must increase strictly")
        if any(not rate >= 0 for rate in self.rates):
            raise ValueError("point rates must be >= 0")
        if self.repeat_s is not None and not self.repeat_s > 0:
            raise ValueError(f"repeat_s must be > 0, got {self.repeat_s!r}")

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
class Surge:
    """A temporary multiplier on the rate: ramps up over `ramp_s`, holds, ramps down."""

    start_s: float
    duration_s: float
    multiplier: float  # 2.0 = twice the usual rate at the surge's height
    ramp_s: float = 300.0

    def __post_init__(self) -> None:
        if not self.duration_s > 0:
            raise ValueError(f"surge duration_s must be > 0, got {self.duration_s!r}")
        if not self.multiplier >= 0:
            raise ValueError(f"surge multiplier must be >= 0, got {self.multiplier!r}")
        if not self.ramp_s >= 0:
            raise ValueError(f"surge ramp_s must be >= 0, got {self.ramp_s!r}")

    def factor(self, t: float) -> float:
        """1.0 outside the surge, `multiplier` at its height, linear on the ramps."""
        into = t - self.start_s
        if into <= 0 or into >= self.duration_s:
            return 1.0
        ramp = min(self.ramp_s, self.duration_s / 2)
        height = 1.0 if ramp == 0 else min(1.0, into / ramp, (self.duration_s - into) / ramp)
        return 1.0 + (self.multiplier - 1.0) * height


def hashed_unit(seed: int, index: int) -> float:
    """A reproducible pseudo-random value in [-1, 1] for (seed, index); no global state.

    A 32-bit integer mix (multiply, xor-shift) so the same seed gives the same noise on every
    machine and every run, which keeps demos and tests replayable.
    """
    mixed = (index * 0x9E3779B1 + seed * 0x85EBCA77 + 0x165667B1) & 0xFFFFFFFF
    mixed ^= mixed >> 16
    mixed = (mixed * 0x7FEB352D) & 0xFFFFFFFF
    mixed ^= mixed >> 15
    mixed = (mixed * 0x846CA68B) & 0xFFFFFFFF
    mixed ^= mixed >> 16
    return (mixed / 0xFFFFFFFF) * 2.0 - 1.0


def smooth_noise(seed: int, t: float, step_s: float) -> float:
    """Value noise in [-1, 1]: hashed values every `step_s`, smoothly interpolated between.

    Continuous in t, so a forecaster sees jitter rather than steps, and rate(t) sampled at
    nearby times agrees.
    """
    position = t / step_s
    index = math.floor(position)
    fraction = position - index
    weight = fraction * fraction * (3.0 - 2.0 * fraction)  # smoothstep
    return (1.0 - weight) * hashed_unit(seed, index) + weight * hashed_unit(seed, index + 1)


@dataclass(frozen=True)
class DiurnalProfile:
    """A synthetic day: `trough_rps` at night, `peak_rps` at `peak_hour`, a cosine in between.

    Profile time 0 is midnight at the start of `start_weekday` (0 = Monday). Days 5 and 6
    (Saturday, Sunday) are multiplied by `weekend_factor` (0.7 = a 30 % weekend dip). `noise`
    is a relative amplitude (0.1 = up to +-10 %) of smooth pseudo-random jitter that changes
    over `noise_step_s` and is fixed by `seed`. `surges` multiply the result.

    Worked example (tests/unit/loadgen/test_loadgen_profiles.py): peak 100, trough 20, peak
    hour 14: rate(14 h) = 100, rate(2 h) = 20, rate(8 h) = 60 (halfway, the cosine's zero).
    """

    peak_rps: float
    trough_rps: float
    peak_hour: float = 14.0
    weekend_factor: float = 1.0
    start_weekday: int = 0
    noise: float = 0.0
    noise_step_s: float = 300.0
    seed: int = 0
    surges: tuple[Surge, ...] = field(default=())
    day_s: float = DAY_S  # the period; a shorter "day" makes quick tests and demos possible

    def __post_init__(self) -> None:
        if not self.trough_rps >= 0:
            raise ValueError(f"trough_rps must be >= 0, got {self.trough_rps!r}")
        if not self.peak_rps >= self.trough_rps:
            raise ValueError(
                f"peak_rps must be >= trough_rps, got peak {self.peak_rps!r} and "
                f"trough {self.trough_rps!r}"
            )
        if not 0 <= self.peak_hour < 24:
            raise ValueError(f"peak_hour must be in [0, 24), got {self.peak_hour!r}")
        if not self.weekend_factor >= 0:
            raise ValueError(f"weekend_factor must be >= 0, got {self.weekend_factor!r}")
        if not 0 <= self.start_weekday <= 6:
            raise ValueError(f"start_weekday must be in 0..6, got {self.start_weekday!r}")
        if not 0 <= self.noise <= 1:
            raise ValueError(f"noise must be in [0, 1], got {self.noise!r}")
        if not self.noise_step_s > 0:
            raise ValueError(f"noise_step_s must be > 0, got {self.noise_step_s!r}")
        if not self.day_s > 0:
            raise ValueError(f"day_s must be > 0, got {self.day_s!r}")

    def base(self, t: float) -> float:
        """The noiseless, surge-free daily curve (with the weekend dip)."""
        peak_at = self.peak_hour / 24.0 * self.day_s
        phase = 2.0 * math.pi * (t - peak_at) / self.day_s
        middle = (self.peak_rps + self.trough_rps) / 2.0
        swing = (self.peak_rps - self.trough_rps) / 2.0
        value = middle + swing * math.cos(phase)
        weekday = (self.start_weekday + math.floor(t / self.day_s)) % 7
        if weekday >= 5:
            value *= self.weekend_factor
        return value

    def rate(self, t: float) -> float:
        value = self.base(t)
        if self.noise:
            value *= 1.0 + self.noise * smooth_noise(self.seed, t, self.noise_step_s)
        for surge in self.surges:
            value *= surge.factor(t)
        return max(value, 0.0)


@dataclass(frozen=True)
class TraceProfile:
    """A request-count trace replayed as a rate.

    Row i covers trace time [timestamps[i], timestamps[i] + interval_s) and holds a count. Profile
    time t maps to trace time `start_s + t * compression` (compression 144 plays a trace day in
    ten minutes). The rate is the row's count per trace second times `amplitude`: compression
    changes how fast the shape goes by, not how many requests per second are sent; `amplitude`
    (see `amplitude_for_peak`) sets that. With `loop`, the trace repeats; without, the first
    and last rows hold outside it.
    """

    timestamps: tuple[float, ...]
    counts: tuple[float, ...]
    interval_s: float
    start_s: float = 0.0
    compression: float = 1.0
    amplitude: float = 1.0
    loop: bool = True

    def __post_init__(self) -> None:
        if len(self.timestamps) != len(self.counts) or not self.counts:
            raise ValueError("a trace needs as many timestamps as counts, at least one row")
        if any(b <= a for a, b in itertools.pairwise(self.timestamps)):
            raise ValueError("trace timestamps must increase strictly")
        if any(not count >= 0 for count in self.counts):
            raise ValueError("trace counts must be >= 0")
        if not self.interval_s > 0:
            raise ValueError(f"interval_s must be > 0, got {self.interval_s!r}")
        if not self.compression > 0:
            raise ValueError(f"compression must be > 0, got {self.compression!r}")
        if not self.amplitude >= 0:
            raise ValueError(f"amplitude must be >= 0, got {self.amplitude!r}")

    @property
    def span_s(self) -> float:
        """Trace seconds covered by the rows."""
        return self.timestamps[-1] + self.interval_s - self.timestamps[0]

    def trace_time(self, t: float) -> float:
        trace_t = self.start_s + t * self.compression
        if self.loop:
            first = self.timestamps[0]
            trace_t = first + (trace_t - first) % self.span_s
        return trace_t

    def rate(self, t: float) -> float:
        index = bisect.bisect_right(self.timestamps, self.trace_time(t)) - 1
        index = min(max(index, 0), len(self.counts) - 1)
        return self.counts[index] / self.interval_s * self.amplitude


def amplitude_for_peak(counts: tuple[float, ...], interval_s: float, peak_rps: float) -> float:
    """The amplitude that makes a trace's busiest row come out at `peak_rps`."""
    busiest = max(counts, default=0.0) / interval_s
    if busiest <= 0:
        raise ValueError("the trace has no requests: cannot scale it to a peak")
    return peak_rps / busiest


def expected_requests(profile: RateProfile, start_s: float, end_s: float, step_s: float) -> float:
    """The integral of rate(t) over [start_s, end_s] (midpoint rule): requests to expect."""
    if end_s <= start_s:
        return 0.0
    steps = max(1, math.ceil((end_s - start_s) / step_s))
    width = (end_s - start_s) / steps
    return sum(profile.rate(start_s + (i + 0.5) * width) for i in range(steps)) * width
