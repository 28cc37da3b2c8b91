"""How long the room serving leaves free is expected to last (issue 26, trainer churn).

Serving releases room toward the forecast's median and takes it back when the forecast's
upper quantile or the priced rise calls for more replicas: trainers that grew into that room
are then preempted, a restart each way. Each plan reads, from every serving workload's
forecast, when serving is expected to need more than this plan gives it, and how much more,
so that training grows only into room that lasts long enough to pay the growth's two
restarts (training/tier.py). Pure; no I/O, no clock."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from tideshift.services.core.constants import EPS
from tideshift.services.planner.core.model import (
    FloatArray,
    Forecast,
    PolicyConfig,
    ServingWorkload,
    Target,
)
from tideshift.services.planner.core.peaks import covering_quantile


@dataclass(frozen=True, slots=True, eq=False)
class Reclaim:
    """What serving is expected to take back of the room it leaves free: by `after_s[k]`
    seconds from now (ascending), serving is expected to hold up to `need[k]` (cpu, memory,
    gpu) more than this plan gives it (non-decreasing)."""

    after_s: FloatArray  # (steps,)
    need: FloatArray  # (steps, 3)

    @classmethod
    def none(cls) -> Reclaim:
        """No serving forecast sees serving take room back."""
        return cls(np.zeros(0), np.zeros((0, 3)))

    def lifetime(self, leftover: FloatArray) -> float | None:
        """Seconds until serving is expected to need more than `leftover` (the room the plan
        leaves free) in some resource, so that it takes room trainers stand on; None when no
        forecast sees it happen."""
        over = np.flatnonzero(np.any(self.need > leftover + EPS, axis=1))
        return float(self.after_s[over[0]]) if over.size else None


def expected_reclaim(
    workloads: Sequence[ServingWorkload],
    forecasts: Mapping[Target, Forecast],
    desired: Sequence[int],
    rise_ratios: Mapping[Target, float],
    *,
    now: float,
    config: PolicyConfig,
) -> Reclaim:
    """Serving's expected need beyond `desired` (its replicas after this plan), summed over
    workloads, at each point of their forecasts: at time t a workload is sized as the planner
    will size it then, for the peak of its quantile over the look-ahead window from t, or
    for the demand observed at t times its priced rise (`rise_ratios`, this plan's),
    whichever needs more. The observation is taken at the quantile too, not the median: one
    high observation scales serving up, and on the median most of the room trainers took
    was taken back within minutes, on observed demand. Stale forecasts are left out
    (serving holds on them)."""
    per_workload: list[tuple[FloatArray, FloatArray]] = []
    for workload, replicas in zip(workloads, desired, strict=True):
        forecast = forecasts.get(workload.target)
        if forecast is None or now - forecast.issued_at > config.max_forecast_age_s:
            continue
        ahead = _extra_replicas(
            workload, forecast, replicas, rise_ratios.get(workload.target, 1.0), now
        )
        if ahead is not None:
            after_s, extra = ahead
            request = np.asarray(workload.replica_requests, dtype=np.float64)
            per_workload.append((after_s, np.maximum.accumulate(extra)[:, None] * request))
    if not per_workload:
        return Reclaim.none()
    after_s = np.unique(np.concatenate([times for times, _ in per_workload]))
    need = np.zeros((after_s.size, 3))
    for times, extra_need in per_workload:
        # Each workload's need holds from its point on (zero before its first point).
        index = np.searchsorted(times, after_s, side="right") - 1
        need += np.where((index >= 0)[:, None], extra_need[np.maximum(index, 0)], 0.0)
    return Reclaim(after_s, need)


def _extra_replicas(
    workload: ServingWorkload,
    forecast: Forecast,
    replicas: int,
    rise_ratio: float,
    now: float,
) -> tuple[FloatArray, FloatArray] | None:
    """Per forecast point from now on: seconds from now, and the replicas the planner is
    expected to give the workload then beyond `replicas` (0 when fewer)."""
    times = np.asarray(forecast.times, dtype=np.float64)
    if times.size == 0 or not forecast.quantiles:
        return None
    upper = covering_quantile(forecast.quantiles, workload.quantile)
    high = np.asarray(forecast.quantiles[upper], dtype=np.float64)
    start = max(int(np.searchsorted(times, now, side="right")) - 1, 0)
    window = workload.lead_time_s + workload.margin_s
    # The look-ahead window's peak from each point: the points in force over [t, t + window].
    points = np.arange(times.size)
    bounds = np.empty(2 * times.size, dtype=np.int64)
    bounds[0::2] = points
    bounds[1::2] = np.maximum(np.searchsorted(times, times + window, side="right"), points + 1)
    peaks = np.maximum.reduceat(np.append(high, -np.inf), bounds)[0::2]
    rps = np.maximum(peaks, high * max(rise_ratio, 1.0))[start:]
    wanted = np.clip(
        np.ceil(rps / workload.capacity_rps - EPS), workload.min_replicas, workload.max_replicas
    )
    after_s = np.maximum(times[start:] - now, 0.0)
    return after_s, np.maximum(wanted - replicas, 0.0)
