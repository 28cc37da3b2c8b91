"""Batch capacity: jobs that opted in (`TrainingJob.batch`) are planned on what serving
reserves but does not use. Per node, the room is serving's idle reservation (its placed
requests x (1 - how busy its forecast keeps it)), within allocatable x (1 - margin) - what
every non-batch pod uses (`cluster.core.overcommit`); room no request holds is not lent, since any
pod (a new job, a serving scale-up) may bind there at once. Batch trainers are the first to
shrink: a trainer on a node whose room fell below it leaves at the next plan, while growth
waits until the room has stayed for `batch_grow_after_s` (the room's rises come and go with
serving's usage every minute). Pure; no I/O."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

import numpy as np

from tideshift.services.cluster.core.overcommit import lendable
from tideshift.services.planner.core.model import (
    FloatArray,
    Infeasible,
    PlanInputs,
    PlanState,
    SteadyRoom,
    Target,
    TargetDecision,
)
from tideshift.services.planner.core.packing import (
    ROOM_SLACK,
    ClusterEntries,
    cluster_entries,
    node_sums,
)
from tideshift.services.planner.core.peaks import forecast_peak
from tideshift.services.planner.core.training import Trainers, plan_tier, tier_priorities


@dataclass(frozen=True, slots=True, eq=False)
class BatchPlan:
    decisions: tuple[TargetDecision, ...]
    infeasible: tuple[Infeasible, ...]
    grew_at: dict[Target, float]
    steady: dict[str, SteadyRoom]


def split_batch(inputs: PlanInputs) -> tuple[PlanInputs, PlanInputs]:
    """(inputs without batch jobs, inputs of the batch jobs alone). Batch trainers hold no
    cpu / memory requests, so the request-based plan sees them as empty pods."""
    on_requests = tuple(job for job in inputs.jobs if not job.batch)
    on_batch = tuple(job for job in inputs.jobs if job.batch)
    return replace(inputs, jobs=on_requests), replace(inputs, serving=(), jobs=on_batch)


def plan_on_batch_room(
    inputs: PlanInputs,
    batch_inputs: PlanInputs,
    entries: ClusterEntries,
    state: PlanState,
    serving_desired: Sequence[int],
    *,
    requested: FloatArray,
    serving_requested: FloatArray,
    grew_at: dict[Target, float],
    growth_frozen: bool,
    now: float,
) -> BatchPlan:
    """The batch jobs on serving's idle reservation now and, for growth, as long ahead as
    growth waits for it (the forecast's)."""
    busy_ahead = serving_busy(
        inputs, serving_desired, now, beyond_s=inputs.config.batch_grow_after_s
    )
    busy_now = serving_busy(inputs, serving_desired, now, ahead=False)
    staying = serving_staying(inputs, entries, serving_desired)
    room_now, room_ahead = (
        batch_room(
            inputs, requested, serving_requested=serving_requested, staying=staying, busy=busy
        )
        for busy in (busy_now, busy_ahead)
    )
    return _plan_batch(
        batch_inputs,
        room_now,
        room_ahead=room_ahead,
        steady=state.batch_room,
        grew_at=grew_at,
        growth_frozen=growth_frozen,
        now=now,
    )


def serving_busy(
    inputs: PlanInputs,
    desired: Sequence[int],
    now: float,
    *,
    ahead: bool = True,
    beyond_s: float = 0.0,
) -> float:
    """The largest fraction of its requests any serving workload uses: with `ahead`, the
    forecast's peak over its look-ahead, or over `beyond_s` when longer (or what is observed,
    when higher); without, now: what is observed (else that peak); / the capacity of its
    replicas (the fewer of desired and current), times the fraction of a request a replica
    uses at capacity. The largest, because the plan places replicas per node, not per
    workload's share."""
    busy = 0.0
    for workload, wanted in zip(inputs.serving, desired, strict=True):
        # Scaling up, the replicas already there carry the demand until the new ones are up.
        replicas = min(wanted, inputs.current.get(workload.target, wanted))
        forecast = inputs.forecasts.get(workload.target)
        horizon = now + max(workload.lead_time_s + workload.margin_s, beyond_s)
        peak = forecast_peak(forecast, now, horizon, workload.quantile) if forecast else None
        observed = inputs.observed_rps.get(workload.target)
        if ahead or observed is None:
            demand = max(peak if peak is not None else np.inf, observed or 0.0)
        else:
            demand = observed
        capacity = replicas * workload.capacity_rps
        fraction = demand / capacity if capacity > 0 else (1.0 if demand > 0 else 0.0)
        busy = max(busy, min(1.0, fraction * workload.target_utilization))
    return busy


def serving_staying(
    inputs: PlanInputs, entries: ClusterEntries, desired: Sequence[int]
) -> FloatArray:
    """Per node (nodes, 3) the requests of serving replicas bound there that stay: a workload
    scaling down from b to d replicas keeps d / b of each node's (which replicas go is the
    ReplicaSet controller's choice, and pods on requests may bind where they were at once;
    counting each node's share lets the batch trainers standing on that room leave first).
    Replicas not bound yet hold no room to lend."""
    serving_count = len(inputs.serving)
    is_serving = entries.row < serving_count
    rows = entries.row[is_serving]
    bound = entries.row_totals[:serving_count].astype(np.float64)
    wanted = np.asarray(desired, dtype=np.float64).reshape(-1)
    kept = np.minimum(1.0, np.divide(wanted, bound, out=np.ones_like(bound), where=bound > 0))
    requests = np.array([w.replica_requests for w in inputs.serving], dtype=np.float64)
    per_entry = (entries.count[is_serving] * kept[rows])[:, None] * requests.reshape(-1, 3)[rows]
    staying = np.zeros_like(entries.fixed)
    for resource in range(3):
        staying[:, resource] = np.bincount(
            entries.node[is_serving], weights=per_entry[:, resource], minlength=staying.shape[0]
        )
    return staying


def hold_released_room(
    inputs: PlanInputs, entries: ClusterEntries, usage: FloatArray
) -> FloatArray:
    """`usage` (requests per node once serving has its replicas) with the replicas serving
    releases this plan still counted: while batch trainers may stand on their idle
    reservation, that room goes to jobs on requests only at the next plan, once the replicas
    the ReplicaSet controller chose have left and the plan sees which batch trainers must go
    with them (otherwise new trainers on requests bind beside batch trainers still there)."""
    serving_count = len(inputs.serving)
    is_serving = entries.row < serving_count
    rows = entries.row[is_serving]
    requests = np.array([w.replica_requests for w in inputs.serving], dtype=np.float64)
    bound = node_sums(
        entries.node[is_serving],
        entries.count[is_serving],
        requests.reshape(-1, 3)[rows],
        usage.shape[0],
    )
    held: FloatArray = entries.fixed + np.maximum(usage - entries.fixed, bound)
    return held


def batch_room(
    inputs: PlanInputs,
    requested: FloatArray,
    *,
    serving_requested: FloatArray,
    staying: FloatArray,
    busy: float,
) -> FloatArray:
    """Per node (nodes, 3) what batch trainers may use: the idle part of what serving keeps
    (`staying`, from `serving_staying`), within allocatable x (1 - margin) minus what
    non-batch pods use: `requested` (what the request-based plan holds, serving included)
    minus the idle part of `serving_requested` (serving's share of it). GPUs are not lent."""
    used = requested - serving_requested * (1.0 - busy)
    room = np.zeros_like(requested)
    room[:, :2] = lendable(
        inputs.cluster.allocatable, used, staying * (1.0 - busy), inputs.config.overcommit
    )
    return room


def _steady_room(
    inputs: PlanInputs, room: FloatArray, previous: Mapping[str, SteadyRoom], now: float
) -> tuple[FloatArray, dict[str, SteadyRoom]]:
    """(per node the room batch trainers may grow into, the state for the next plan). A node
    seen for the first time grants nothing until its room has stayed a whole period."""
    hold_s = inputs.config.batch_grow_after_s
    names = inputs.cluster.node_names
    if hold_s <= 0:
        return room, {}
    granted = np.zeros_like(room)
    watch: dict[str, SteadyRoom] = {}
    for row, name in enumerate(names):
        here = (float(room[row, 0]), float(room[row, 1]))
        seen = previous.get(name)
        if seen is None:
            entry = SteadyRoom(granted=(0.0, 0.0), low=here, since=now)
        else:
            low = (min(seen.low[0], here[0]), min(seen.low[1], here[1]))
            if now - seen.since >= hold_s:
                entry = SteadyRoom(granted=low, low=here, since=now)
            else:
                grant = (min(seen.granted[0], here[0]), min(seen.granted[1], here[1]))
                entry = SteadyRoom(granted=grant, low=low, since=seen.since)
        watch[name] = entry
        granted[row, :2] = entry.granted
    return granted, watch


def _plan_batch(
    inputs: PlanInputs,
    room: FloatArray,
    *,
    room_ahead: FloatArray,
    steady: Mapping[str, SteadyRoom],
    grew_at: Mapping[Target, float],
    growth_frozen: bool,
    now: float,
) -> BatchPlan:
    """The batch jobs' trainers, tier by tier: trainers stay where `room` (serving's usage
    now) still holds them (those on nodes whose room shrank below them leave at once, and then
    nothing grows) and grow only into the steady part of `room_ahead` (its usage until the
    next plan, from the forecast): growth is conservative, while trainers the scheduler put
    where the forecast lends less are not sent away before serving's usage needs it."""
    entries = cluster_entries(inputs)
    trainers = Trainers.of(inputs, entries)
    granted, watch = _steady_room(inputs, np.minimum(room_ahead, room), steady, now)
    bound = node_sums(trainers.node, trainers.count, trainers.requests[trainers.job], room.shape[0])
    holds = np.all(bound <= room + ROOM_SLACK, axis=1)
    # Each node offers its trainers what they hold plus the steady room beyond. Once some
    # node's room shrank below its trainers, those leave and none start elsewhere this plan:
    # the executor removes trainers by count where room is shortest, so a move would leave
    # them where they are.
    beyond = granted if holds.all() else bound
    free = np.where(holds[:, None], np.maximum(beyond, bound), room)
    decisions: list[TargetDecision] = []
    infeasible: list[Infeasible] = []
    grown = dict(grew_at)
    for tier in tier_priorities(inputs):
        outcome = plan_tier(
            inputs, trainers, tier, free, grew_at=grown, growth_frozen=growth_frozen, now=now
        )
        decisions += [
            replace(item, reason=_on_batch(item.reason, room)) for item in outcome.decisions
        ]
        infeasible += [
            replace(item, reason=_on_batch(item.reason, room)) for item in outcome.infeasible
        ]
        free, grown = outcome.free, outcome.grew_at
    return BatchPlan(tuple(decisions), tuple(infeasible), grown, watch)


def _on_batch(reason: str, room: FloatArray) -> str:
    cpu = float(room[:, 0].sum()) if room.size else 0.0
    return (
        f"batch capacity ({cpu:.3g} cpu serving reserves but does not use; "
        f"shrunk first when its usage rises): {reason}"
    )
