"""Serving's replicas, read top to bottom: each workload sized from the forecast's peak over
the look-ahead window and its priced headroom (serving/headroom.py), the safety net (observed
demand above what the forecast allowed sizes serving for it at once and opens a panic window
that holds scale-down), scale-down only to what the release horizon's median needs or the
stabilisation window's highest recommendation; then where the replicas go (free room first,
then room trainers must give back), and the words of each decision. Pure; no I/O, no clock."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np

from tideshift.services.cluster.core.placement import compact_down, entry_rest
from tideshift.services.core.constants import EPS
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
from tideshift.services.planner.core.peaks import covering_quantile, forecast_peak
from tideshift.services.planner.core.serving import headroom
from tideshift.services.planner.core.serving.price import service_level


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


@dataclass(frozen=True, slots=True)
class _ServingSize:
    """One serving workload's count after a plan, why, and its updated windows."""

    desired: int
    reason: str
    history: tuple[tuple[float, int], ...]  # (time, recommended) within the stabilisation window
    miss: Miss
    fallback: str | None = None  # the announcement when held for want of a usable forecast
    headroom: HeadroomParts | None = None


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
) -> _ServingSize:
    """The workload's replicas.

    Sized at the workload's priced level (serving/price.py: where the expected cost of a
    shortfall meets the training displaced) of the demand over the look-ahead window, from
    the forecast's quantiles and from the workload's own recent rises within one lead time
    (serving/headroom.py; the large rises recurring on a schedule when one is due).
    The safety net: a forecast can be wrong and serving must not pay for it. Observed demand
    above what the forecast allowed for now sizes serving for that demand at once and holds
    scale-down through the panic window.
    """
    level = service_level(workload)
    peaks: _Peaks | None = None
    if (
        forecast is not None
        and not forecast.untrusted
        and now - forecast.issued_at <= config.max_forecast_age_s
    ):
        peaks = _forecast_peaks(workload, forecast, now, config, level)
    allowed = peaks.allowed if peaks is not None else None
    new_miss = track_miss(miss, observed=observed, allowed=allowed, now=now, config=config)
    rises = headroom.observe(workload, new_miss.rises, observed, now, config)
    new_miss = replace(new_miss, rises=rises)
    observed_need = _replicas_for(observed, workload) if observed is not None else 0
    if peaks is None:
        held = min(max(current, observed_need, workload.min_replicas), workload.max_replicas)
        why = _no_usable_forecast(forecast)
        fallback = _held_fallback(workload.target, why)
        return _ServingSize(held, _holding(held, why), history, new_miss, fallback)
    parts = _parts(workload, peaks, new_miss, observed, now, level=level)
    recommendation = _recommend(workload, parts, observed_need)
    cutoff = now - workload.stabilization_s
    new_history = (*(item for item in history if item[0] > cutoff), (now, recommendation.replicas))
    if recommendation.replicas >= current:
        reason = _scale_up(recommendation.basis, up=recommendation.replicas > current)
        return _ServingSize(recommendation.replicas, reason, new_history, new_miss, None, parts)
    held_why = _scale_down_hold(
        workload, new_miss, seen_since=seen_since, now=now, stale=cluster_stale
    )
    if held_why is not None:
        reason = f"{recommendation.basis}; {held_why}"
        return _ServingSize(current, reason, new_history, new_miss, None, parts)
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
    return _ServingSize(desired, reason, new_history, new_miss, None, parts)


@dataclass(frozen=True, slots=True)
class _Peaks:
    """The forecast's peaks (req/s) that size a workload, from a fresh forecast."""

    window: float  # over the look-ahead window (lead time + margin)
    level: float  # the forecast quantile read: the priced level's covering one
    allowed: float | None  # now: what the forecast allows for the demand observed now
    release: float  # the median's, over the release horizon (at least the look-ahead window)


def _forecast_peaks(
    workload: ServingWorkload, forecast: Forecast, now: float, config: PolicyConfig, level: float
) -> _Peaks | None:
    """The peaks of a fresh forecast at the priced `level` (its closest quantile at or above,
    the highest when none is); None when no point of it covers the look-ahead window."""
    window_end = now + workload.lead_time_s + workload.margin_s
    window = forecast_peak(forecast, now, window_end, level)
    if window is None:
        return None
    release_end = now + max(config.release_horizon_s, window_end - now)
    # Whether to release room is a bet on what the next minutes will use (a restart each way
    # if they use it), so it is made on the forecast's median: the safety margin is the
    # look-ahead window's quantile and the priced rise, which scale-down keeps anyway.
    release = forecast_peak(forecast, now, release_end, 0.5)
    return _Peaks(
        window=window,
        level=covering_quantile(forecast.quantiles, level),
        allowed=forecast_peak(forecast, now, now, level),
        release=release if release is not None else 0.0,
    )


@dataclass(frozen=True, slots=True)
class _Recommendation:
    """The count the forecast and the safety net recommend, before the scale-down rules."""

    replicas: int
    basis: str  # how it was reached (the reason's first part)
    parts: HeadroomParts


def _parts(
    workload: ServingWorkload,
    peaks: _Peaks,
    miss: Miss,
    observed: float | None,
    now: float,
    *,
    level: float,
) -> HeadroomParts:
    rise, rise_ratio, period_s, quantile = headroom.priced_rise(
        workload, miss.rises, observed, now, level
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
        forecast_level=peaks.level,
    )


def _recommend(
    workload: ServingWorkload, parts: HeadroomParts, observed_need: int
) -> _Recommendation:
    """The forecast's peak, or where observed demand may rise within one lead time, or the
    observed demand, whichever needs most, within the workload's bounds."""
    forecast_need = _replicas_for(parts.forecast, workload)
    rise_need = _replicas_for(parts.rise, workload)
    need = max(forecast_need, rise_need, observed_need)
    replicas = min(max(need, workload.min_replicas), workload.max_replicas)
    basis = _serving_basis(
        workload,
        level=parts.forecast_level,
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
    return _Recommendation(replicas, basis, parts)


def _replicas_for(rps: float, workload: ServingWorkload) -> int:
    return math.ceil(rps / workload.capacity_rps - EPS)


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
        return _STALE_NO_SCALE_DOWN
    if now - seen_since < workload.stabilization_s:
        return _not_observed_long_enough(workload)
    if now < miss.panic_until:
        return _PANIC_WINDOW
    return None


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
            return current, _release_held(basis, kept, config)
        return kept, _release_to_forecast(basis, config)
    if stabilized < current:
        return stabilized, _down_to_stabilized(basis, workload)
    return current, _held_by_stabilization(basis)


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
    hours); the priced rise (serving/headroom.py) keeps what the workload's rises call for."""
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
            infeasible.append(Infeasible(workload.target, _replicas_unplaced(rest, additions[row])))
    return tuple(infeasible)


# ---- the words of serving's decisions -----------------------------------------------------

# Leads every reason in which the safety net (observed demand, the priced rise or the panic
# window), not the bare forecast, set serving's count.
PANIC = "panic (safety net):"
_STALE_NO_SCALE_DOWN = "cluster view stale: not scaling down"
_PANIC_WINDOW = f"{PANIC} demand ran above the forecast: no scale-down in the panic window"


def _no_usable_forecast(forecast: Forecast | None) -> str:
    if forecast is None:
        return "no forecast"
    if forecast.untrusted:
        return f"forecast untrusted ({forecast.untrusted}): sized on observed demand"
    return "forecast stale or not covering the window"


def _holding(held: int, why: str) -> str:
    return f"holding {held}: {why}"


def _held_fallback(target: Target, why: str) -> str:
    """The safe-mode announcement of a serving workload held for want of a forecast."""
    return f"{target}: {why}; holding"


def _serving_basis(
    workload: ServingWorkload,
    *,
    level: float,
    peak: float,
    forecast_need: int,
    rise: tuple[float, int, float, float] | None,
    observed: float | None,
    observed_need: int,
    clamped: bool,
    safety_net: bool,
) -> str:
    """How serving's count was reached; `rise` (the calibrated rise, the replicas it needs,
    the period of the recurring rise that set it or 0, else the quantile of rises that set
    it or 0 for the rise just seen) and `observed` only when they need more than the
    forecast."""
    basis = (
        f"forecast q{level:g} peak {peak:.1f} req/s over the next "
        f"{workload.lead_time_s + workload.margin_s:.0f} s / {workload.capacity_rps:g} req/s "
        f"per replica"
    )
    basis += f" = {forecast_need}"
    if rise is not None:
        ratio, need, period_s, quantile = rise
        source = (
            f"a rise recurring every {period_s / 60:.0f} min is due"
            if period_s > 0
            else f"q{quantile:.4g} of recent rises"
            if quantile > 0
            else "the rise just seen, demand above what the forecast allowed"
        )
        basis += (
            f"; observed may rise x {ratio:.2f} within the {workload.lead_time_s:.0f} s "
            f"lead time ({source}), needs {need}"
        )
    if observed is not None:
        basis += f"; observed {observed:.1f} req/s needs {observed_need}"
    if clamped:
        basis += f", clamped to [{workload.min_replicas}, {workload.max_replicas}]"
    return f"{PANIC} {basis}" if safety_net else basis


def _scale_up(basis: str, *, up: bool) -> str:
    return f"{basis}; scale up now" if up else basis


def _not_observed_long_enough(workload: ServingWorkload) -> str:
    return f"no scale-down until {workload.stabilization_s:.0f} s observed"


def _release_held(basis: str, kept: int, config: PolicyConfig) -> str:
    return (
        f"{basis}; scale-down held: the forecast's median needs {kept} within "
        f"{config.release_horizon_s:.0f} s"
    )


def _release_to_forecast(basis: str, config: PolicyConfig) -> str:
    return (
        f"{basis}; scale down to what the forecast's median needs within "
        f"{config.release_horizon_s:.0f} s"
    )


def _down_to_stabilized(basis: str, workload: ServingWorkload) -> str:
    return (
        f"{basis}; scale down to the highest recommendation of the last "
        f"{workload.stabilization_s:.0f} s"
    )


def _held_by_stabilization(basis: str) -> str:
    return f"{basis}; scale-down held by the stabilisation window"


def _replicas_unplaced(rest: int, additions: int) -> str:
    return f"{rest} of {additions} new replicas fit on no node even with all training removed"
