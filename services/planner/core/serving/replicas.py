"""Serving sizing: replicas from the forecast's peak over the look-ahead window, scaled down
only to the stabilisation window's highest recommendation; then where the replicas go (free
room first, then room trainers must give back). Pure; no I/O, no clock."""

from __future__ import annotations

import bisect
import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np

from tideshift.services.cluster.core.placement import compact_down, entry_rest
from tideshift.services.planner.core import headroom, reasons
from tideshift.services.planner.core.model import (
    BoolArray,
    FloatArray,
    Forecast,
    HeadroomParts,
    Infeasible,
    IntArray,
    Miss,
    PlanInputs,
    PlanState,
    PolicyConfig,
    Rises,
    ServingWorkload,
    Target,
    TargetDecision,
)
from tideshift.services.planner.core.packing import (
    ClusterEntries,
    node_sums,
    pack_sparse,
)


def forecast_peak(forecast: Forecast, start: float, end: float, quantile: float) -> float | None:
    """Highest value of the closest quantile >= `quantile` over [start, end].

    None when the forecast has no point in force during the window (it ends before `start`,
    or starts after `end`).
    """
    available = sorted(forecast.quantiles)
    if not available or not forecast.times:
        return None
    chosen = next((q for q in available if q >= quantile - 1e-12), available[-1])
    values = forecast.quantiles[chosen]
    times = forecast.times
    step = times[1] - times[0] if len(times) > 1 else 0.0
    if times[0] > end or times[-1] + step < start:
        return None
    # The point in force at `start` is the last one at or before it.
    first = max(bisect.bisect_right(times, start) - 1, 0)
    last = bisect.bisect_right(times, end)
    return float(max(values[first:last]))


def track_miss(
    miss: Miss | None,
    *,
    observed: float | None,
    allowed: float | None,
    now: float,
    config: PolicyConfig,
) -> Miss:
    """The workload's miss after this observation: one above what the forecast allowed
    starts a panic window.

    No memory of the miss outlives the window (a faded miss ratio held a spike's height for
    hours); the priced rise (policy/headroom.py) keeps what the workload's rises call for."""
    panic_until = -math.inf if miss is None else miss.panic_until
    previous = None if miss is None else miss.observed
    # A q0.95 forecast is exceeded 5 % of the time by design: only a miss beyond the
    # tolerance counts, or serving would chase every burst and trainers with it.
    if (
        observed is not None
        and allowed is not None
        and observed > allowed * (1.0 + config.miss_tolerance)
    ):
        panic_until = now + config.panic_window_s
    return Miss(
        panic_until=panic_until,
        observed=observed if observed is not None else previous,
        rises=Rises() if miss is None else miss.rises,
    )


@dataclass(frozen=True, slots=True)
class ServingSize:
    """One serving workload's count after a plan, why, and its updated windows."""

    desired: int
    reason: str
    history: tuple[tuple[float, int], ...]  # (time, recommended) within the stabilisation window
    miss: Miss
    fallback: str | None = None  # the announcement when held for want of a usable forecast
    headroom: HeadroomParts | None = None


@dataclass(frozen=True, slots=True)
class Peaks:
    """The forecast's peaks (req/s) that size a workload, from a fresh forecast."""

    window: float  # over the look-ahead window (lead time + margin)
    allowed: float | None  # now: what the forecast allows for the demand observed now
    release: float  # the median's, over the release horizon (at least the look-ahead window)


@dataclass(frozen=True, slots=True)
class Recommendation:
    """The count the forecast and the safety net recommend, before the scale-down rules."""

    replicas: int
    basis: str  # how it was reached (the reason's first part)
    parts: HeadroomParts


def plan_serving(
    workload: ServingWorkload,
    forecast: Forecast | None,
    *,
    current: int,
    history: tuple[tuple[float, int], ...],
    seen_since: float,
    now: float,
    config: PolicyConfig,
    cluster_stale: bool,
    observed: float | None = None,
    miss: Miss | None = None,
) -> ServingSize:
    """The workload's replicas.

    The safety net: a forecast can be wrong and serving must not pay for it. Observed demand
    above what the forecast allowed for now sizes serving for that demand at once and holds
    scale-down through the panic window. The headroom is priced (policy/headroom.py): what
    demand may reach a lead time on at a quantile of its own recent rises (`rise_quantile`
    at least), or of the large rises recurring on a schedule when one is due.
    """
    peaks: Peaks | None = None
    if forecast is not None and now - forecast.issued_at <= config.max_forecast_age_s:
        peaks = forecast_peaks(workload, forecast, now, config)
    allowed = peaks.allowed if peaks is not None else None
    new_miss = track_miss(miss, observed=observed, allowed=allowed, now=now, config=config)
    rises = headroom.observe(workload, new_miss.rises, observed, now, config)
    new_miss = replace(new_miss, rises=rises)
    observed_need = _replicas_for(observed, workload) if observed is not None else 0
    if peaks is None:
        held = min(max(current, observed_need, workload.min_replicas), workload.max_replicas)
        why = reasons.no_usable_forecast(has_forecast=forecast is not None)
        fallback = reasons.held_fallback(workload.target, why)
        return ServingSize(held, reasons.holding(held, why), history, new_miss, fallback)
    parts = _parts(workload, peaks, new_miss, observed, now, config=config)
    recommendation = recommend(workload, parts, observed_need)
    cutoff = now - workload.stabilization_s
    new_history = (*(item for item in history if item[0] > cutoff), (now, recommendation.replicas))
    if recommendation.replicas >= current:
        reason = reasons.scale_up(recommendation.basis, up=recommendation.replicas > current)
        return ServingSize(recommendation.replicas, reason, new_history, new_miss, None, parts)
    held_why = _scale_down_hold(
        workload, new_miss, seen_since=seen_since, now=now, stale=cluster_stale
    )
    if held_why is not None:
        reason = f"{recommendation.basis}; {held_why}"
        return ServingSize(current, reason, new_history, new_miss, None, parts)
    # Released room costs trainers a restart each way: release only what is not needed soon.
    kept = _replicas_for(max(peaks.release, parts.rise, 0.0), workload)
    desired, reason = _scale_down(
        workload,
        recommendation.basis,
        current=current,
        kept=kept,
        history=new_history,
        config=config,
    )
    return ServingSize(desired, reason, new_history, new_miss, None, parts)


def _parts(
    workload: ServingWorkload,
    peaks: Peaks,
    miss: Miss,
    observed: float | None,
    now: float,
    *,
    config: PolicyConfig,
) -> HeadroomParts:
    rise, rise_ratio, period_s, quantile = headroom.priced_rise(
        workload, miss.rises, observed, now, config
    )
    # While demand runs above what the forecast allowed, a flash crowd may come in waves:
    # the next is priced at least as the rise just seen (the 48 h family-flash-crowds run
    # starved a minute after its first jump, 1,580 -> 2,247 req/s, at the usual 1.26x).
    wave = headroom.recent_rise(miss.rises, now=now, lead_time_s=workload.lead_time_s)
    if observed and now < miss.panic_until and wave > rise_ratio:
        rise, rise_ratio, period_s, quantile = observed * wave, wave, 0.0, 0.0
    return HeadroomParts(
        forecast=max(peaks.window, 0.0),
        rise=rise,
        rise_ratio=rise_ratio,
        observed=observed or 0.0,
        panic_hold=now < miss.panic_until,
        recurring_period_s=period_s,
        rise_quantile=quantile,
    )


def forecast_peaks(
    workload: ServingWorkload, forecast: Forecast, now: float, config: PolicyConfig
) -> Peaks | None:
    """The peaks of a fresh forecast; None when no point of it covers the look-ahead window."""
    window_end = now + workload.lead_time_s + workload.margin_s
    window = forecast_peak(forecast, now, window_end, workload.quantile)
    if window is None:
        return None
    release_end = now + max(config.release_horizon_s, window_end - now)
    # Whether to release room is a bet on what the next minutes will use (a restart each way
    # if they use it), so it is made on the forecast's median: the safety margin is the
    # look-ahead window's quantile and the priced rise, which scale-down keeps anyway.
    release = forecast_peak(forecast, now, release_end, 0.5)
    return Peaks(
        window=window,
        allowed=forecast_peak(forecast, now, now, workload.quantile),
        release=release if release is not None else 0.0,
    )


def _replicas_for(rps: float, workload: ServingWorkload) -> int:
    return math.ceil(rps / workload.capacity_rps - 1e-9)


def recommend(
    workload: ServingWorkload, parts: HeadroomParts, observed_need: int
) -> Recommendation:
    """The forecast's peak, or where observed demand may rise within one lead time, or the
    observed demand, whichever needs most, within the workload's bounds."""
    forecast_need = _replicas_for(parts.forecast, workload)
    rise_need = _replicas_for(parts.rise, workload)
    need = max(forecast_need, rise_need, observed_need)
    replicas = min(max(need, workload.min_replicas), workload.max_replicas)
    basis = reasons.serving_basis(
        workload,
        peak=parts.forecast,
        forecast_need=forecast_need,
        rise=(parts.rise_ratio, rise_need, parts.recurring_period_s, parts.rise_quantile)
        if rise_need > max(forecast_need, observed_need)
        else None,
        observed=parts.observed
        if observed_need > forecast_need and observed_need >= rise_need
        else None,
        observed_need=observed_need,
        clamped=replicas != need,
        # The operator's cue that the safety net, not the bare forecast, sized serving.
        safety_net=need > forecast_need,
    )
    return Recommendation(replicas, basis, parts)


def _scale_down(
    workload: ServingWorkload,
    basis: str,
    *,
    current: int,
    kept: int,
    history: tuple[tuple[float, int], ...],
    config: PolicyConfig,
) -> tuple[int, str]:
    """How far serving goes down: to what the forecast needs within the release horizon or
    to the stabilisation window's highest recommendation, whichever is more."""
    stabilized = max(value for _, value in history)
    if kept > stabilized:
        if kept >= current:
            return current, reasons.release_held(basis, kept, config)
        return kept, reasons.release_to_forecast(basis, config)
    if stabilized < current:
        return stabilized, reasons.down_to_stabilized(basis, workload)
    return current, reasons.held_by_stabilization(basis)


def _scale_down_hold(
    workload: ServingWorkload,
    miss: Miss,
    *,
    seen_since: float,
    now: float,
    stale: bool,
) -> str | None:
    """Why serving may not scale down now, or None."""
    if stale:
        return reasons.STALE_NO_SCALE_DOWN
    if now - seen_since < workload.stabilization_s:
        return reasons.not_observed_long_enough(workload)
    if now < miss.panic_until:
        return reasons.PANIC_WINDOW
    return None


@dataclass(frozen=True, slots=True)
class ServingPlan:
    desired: tuple[int, ...]  # per serving workload, in input order
    decisions: tuple[TargetDecision, ...]
    history: dict[Target, tuple[tuple[float, int], ...]]
    seen_since: dict[Target, float]
    fallbacks: tuple[str, ...]
    misses: dict[Target, Miss]


def size_serving(
    inputs: PlanInputs, state: PlanState, now: float, bound_totals: IntArray
) -> ServingPlan:
    """Every serving workload's replicas, with the updated windows."""
    history = dict(state.serving_history)
    seen = dict(state.serving_seen_since)
    misses = dict(state.serving_misses)
    desired_all: list[int] = []
    decisions: list[TargetDecision] = []
    fallbacks: list[str] = []
    for row, workload in enumerate(inputs.serving):
        target = workload.target
        current = inputs.current.get(target, int(bound_totals[row]))
        size = plan_serving(
            workload,
            inputs.forecasts.get(target),
            current=current,
            history=state.serving_history.get(target, ()),
            seen_since=seen.setdefault(target, now),
            now=now,
            config=inputs.config,
            cluster_stale=inputs.cluster_stale,
            observed=inputs.observed_rps.get(target),
            miss=state.serving_misses.get(target),
        )
        history[target], misses[target] = size.history, size.miss
        if size.fallback is not None:
            fallbacks.append(size.fallback)
        desired_all.append(size.desired)
        decisions.append(
            TargetDecision(target, "serving", current, size.desired, size.reason, size.headroom)
        )
    return ServingPlan(
        tuple(desired_all), tuple(decisions), history, seen, tuple(fallbacks), misses
    )


def place_serving(
    inputs: PlanInputs, entries: ClusterEntries, desired: Sequence[int]
) -> tuple[FloatArray, tuple[Infeasible, ...]]:
    """Requests per node once serving has its replicas (pods the plan does not scale
    included; trainers not), and the replicas that fit nowhere."""
    allocatable = inputs.cluster.allocatable
    node_count = allocatable.shape[0]
    serving_count = len(inputs.serving)
    serving_requests = np.array(
        [w.replica_requests for w in inputs.serving], dtype=np.float64
    ).reshape(-1, 3)
    job_requests = np.array(
        [job.trainer_requests for job in inputs.jobs], dtype=np.float64
    ).reshape(-1, 3)
    is_serving = entries.row < serving_count
    rows, nodes = entries.row[is_serving], entries.node[is_serving]
    job_rows = entries.row[~is_serving] - serving_count
    trainer_usage = node_sums(
        entries.node[~is_serving], entries.count[~is_serving], job_requests[job_rows], node_count
    )
    counts = entries.count[is_serving]

    def rest_fullness(mask: BoolArray) -> FloatArray:
        serving_now = node_sums(nodes, counts, serving_requests[rows], node_count)
        return entry_rest(
            entries.fixed + serving_now + trainer_usage,
            allocatable,
            nodes[mask],
            counts[mask],
            serving_requests[rows[mask]],
        )

    # Scale-down removes the replicas that free whole nodes (the executor's deletion cost).
    stays = compact_down(
        counts, rows, serving_count, np.asarray(desired, dtype=np.int64), rest_fullness
    )
    usage = entries.fixed + node_sums(nodes, stays, serving_requests[rows], node_count)
    rooms = _Rooms(
        allocatable=allocatable,
        usage=usage,
        free_of_all=allocatable - usage - trainer_usage,
        free_of_serving=allocatable - usage,
    )
    stayed = np.bincount(rows, weights=stays, minlength=serving_count)
    additions = [desired[row] - int(stayed[row]) for row in range(serving_count)]
    return usage, _place_additions(inputs, rooms, serving_requests, additions)


@dataclass(frozen=True, slots=True)
class _Rooms:
    """Per node, booked as replicas are placed: what the plan uses, what the scheduler finds
    free, and what serving can take by preempting trainers."""

    allocatable: FloatArray
    usage: FloatArray
    free_of_all: FloatArray
    free_of_serving: FloatArray

    def take(self, room: FloatArray, request: FloatArray, count: int) -> int:
        """Pack up to `count` replicas into `room`; book them everywhere; returns the rest."""
        nodes, placed = pack_sparse(room, request, count, self.allocatable)
        taken = placed[:, None] * request
        self.usage[nodes] += taken
        self.free_of_all[nodes] -= taken
        self.free_of_serving[nodes] -= taken
        return count - int(placed.sum())


def _place_additions(
    inputs: PlanInputs, rooms: _Rooms, serving_requests: FloatArray, additions: Sequence[int]
) -> tuple[Infeasible, ...]:
    """Place each workload's new replicas; the ones that fit nowhere."""
    infeasible: list[Infeasible] = []
    for row, workload in enumerate(inputs.serving):
        if additions[row] <= 0:
            continue
        # Free room first (what the scheduler does), then room trainers must give back.
        rest = additions[row]
        for room in (rooms.free_of_all, rooms.free_of_serving):
            rest = rooms.take(room, serving_requests[row], rest)
            if rest <= 0:
                break
        if rest > 0:
            infeasible.append(
                Infeasible(workload.target, reasons.replicas_unplaced(rest, additions[row]))
            )
    return tuple(infeasible)
