"""Batch capacity: jobs that opted in (`TrainingJob.batch`) are planned on what serving
reserves but does not use. Per node, reclaimable = allocatable x (1 - margin) - what every
non-batch pod uses (`cluster.overcommit`), where serving uses its placed requests x how busy
its forecast keeps it and every other pod its requests; batch trainers are fitted into that,
tier by tier, and are the first to shrink when serving's usage rises. Pure; no I/O."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

import numpy as np

from tideshift.services.cluster.overcommit import reclaimable
from tideshift.services.planner.policy import reasons
from tideshift.services.planner.policy.model import (
    FloatArray,
    Infeasible,
    PlanInputs,
    Target,
    TargetDecision,
)
from tideshift.services.planner.policy.packing import cluster_entries
from tideshift.services.planner.policy.serving import forecast_peak
from tideshift.services.planner.policy.training import Trainers, plan_tier, tier_priorities


@dataclass(frozen=True, slots=True, eq=False)
class BatchPlan:
    decisions: tuple[TargetDecision, ...]
    infeasible: tuple[Infeasible, ...]
    grew_at: dict[Target, float]


def split_batch(inputs: PlanInputs) -> tuple[PlanInputs, PlanInputs]:
    """(inputs without batch jobs, inputs of the batch jobs alone). Batch trainers hold no
    cpu / memory requests, so the request-based plan sees them as empty pods."""
    on_requests = tuple(job for job in inputs.jobs if not job.batch)
    on_batch = tuple(job for job in inputs.jobs if job.batch)
    return replace(inputs, jobs=on_requests), replace(inputs, serving=(), jobs=on_batch)


def serving_busy(inputs: PlanInputs, desired: Sequence[int], now: float) -> float:
    """The largest fraction of its requests any serving workload uses until the next plan:
    the forecast's peak over its look-ahead (or what is observed, when higher) / the desired
    replicas' capacity, times the fraction of a request a replica uses at capacity. The
    largest, because the plan places replicas per node, not per workload's share."""
    busy = 0.0
    for workload, replicas in zip(inputs.serving, desired, strict=True):
        forecast = inputs.forecasts.get(workload.target)
        horizon = now + workload.lead_time_s + workload.margin_s
        peak = forecast_peak(forecast, now, horizon, workload.quantile) if forecast else None
        observed = inputs.observed_rps.get(workload.target)
        demand = max(peak if peak is not None else np.inf, observed or 0.0)
        capacity = replicas * workload.capacity_rps
        fraction = demand / capacity if capacity > 0 else (1.0 if demand > 0 else 0.0)
        busy = max(busy, min(1.0, fraction * workload.target_utilization))
    return busy


def batch_room(
    inputs: PlanInputs, requested: FloatArray, serving_requested: FloatArray, busy: float
) -> FloatArray:
    """Per node (nodes, 3) what batch trainers may use: `requested` is what the request-based
    plan places (serving included), `serving_requested` serving's part of it; GPUs are not
    lent."""
    used = requested - serving_requested * (1.0 - busy)
    room = np.zeros_like(requested)
    room[:, :2] = reclaimable(inputs.cluster.allocatable, used, inputs.config.overcommit)
    return room


def plan_batch(
    inputs: PlanInputs,
    room: FloatArray,
    *,
    grew_at: Mapping[Target, float],
    growth_frozen: bool,
    now: float,
) -> BatchPlan:
    """The batch jobs' trainers, tier by tier, on `room` instead of free requests: trainers
    on nodes whose reclaimable capacity shrank below them are the ones that leave."""
    entries = cluster_entries(inputs)
    trainers = Trainers.of(inputs, entries)
    decisions: list[TargetDecision] = []
    infeasible: list[Infeasible] = []
    free, grown = room, dict(grew_at)
    for tier in tier_priorities(inputs):
        outcome = plan_tier(
            inputs, trainers, tier, free, grew_at=grown, growth_frozen=growth_frozen, now=now
        )
        decisions += [
            replace(item, reason=reasons.on_batch(item.reason, room)) for item in outcome.decisions
        ]
        infeasible += [
            replace(item, reason=reasons.on_batch(item.reason, room)) for item in outcome.infeasible
        ]
        free, grown = outcome.free, outcome.grew_at
    return BatchPlan(tuple(decisions), tuple(infeasible), grown)
