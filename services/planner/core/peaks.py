"""Reading a forecast: which of its quantiles stands for the one asked, and that quantile's peak
over a window. Serving sizes on it, the room's lifetime and both loans of serving's room read
it. Pure; no I/O."""

from __future__ import annotations

import bisect
from collections.abc import Iterable

from tideshift.services.planner.core.model import Forecast

# Quantile levels are matched tighter than `EPS` (services/core/constants.py) on purpose: only
# the float rounding of one level (about 1e-16) makes two levels the same; a level 1e-9 below
# another is another level.
QUANTILE_MATCH = 1e-12


def covering_quantile(available: Iterable[float], quantile: float) -> float:
    """The closest of `available` at or above `quantile` (the highest when none is)."""
    ordered = sorted(available)
    return next((q for q in ordered if q >= quantile - QUANTILE_MATCH), ordered[-1])


def forecast_peak(forecast: Forecast, start: float, end: float, quantile: float) -> float | None:
    """Highest value of the closest quantile >= `quantile` over [start, end].

    None when the forecast has no point in force during the window (it ends before `start`,
    or starts after `end`).
    """
    if not forecast.quantiles or not forecast.times:
        return None
    values = forecast.quantiles[covering_quantile(forecast.quantiles, quantile)]
    times = forecast.times
    step = times[1] - times[0] if len(times) > 1 else 0.0
    if times[0] > end or times[-1] + step < start:
        return None
    # The point in force at `start` is the last one at or before it.
    first = max(bisect.bisect_right(times, start) - 1, 0)
    last = bisect.bisect_right(times, end)
    return float(max(values[first:last]))
