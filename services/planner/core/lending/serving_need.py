"""Serving's need over the lead time as one plan sized it, for what lends the rest of the
cluster outside the planner (the executor's quota lent to Kueue, docs/guides/kueue.md).
Pure: the plan's inputs and decision in, totals out."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from tideshift.services.planner.core.model import Decision, FloatArray, PlanInputs
from tideshift.services.planner.core.peaks import forecast_peak

# Serving's expected need reads this quantile of the forecast (the closest at or above it).
EXPECTED_QUANTILE = 0.5


@dataclass(frozen=True, slots=True)
class ServingNeedParts:
    """Each (cpu cores, memory bytes, gpu devices), summed over the schedulable nodes."""

    capacity: FloatArray
    reserved: FloatArray  # the plan's serving sizes (at least what runs) x replica requests
    expected: FloatArray  # the median forecast's peak over the lead time, at least what runs
    other: FloatArray  # what else the plan places: training, pods of no target


def serving_need(inputs: PlanInputs, decision: Decision, now: float) -> ServingNeedParts:
    """What serving reserves and is expected to need within each workload's lead time."""
    desired = decision.desired()
    reserved = np.zeros(3)
    expected = np.zeros(3)
    placed_serving = np.zeros(3)
    for workload in inputs.serving:
        running = max(inputs.current.get(workload.target, 0), 0)
        planned = desired.get(workload.target, running)
        requests = np.asarray(workload.replica_requests, dtype=np.float64)
        reserved += max(planned, running) * requests
        placed_serving += planned * requests
        forecast = inputs.forecasts.get(workload.target)
        peak = None
        if forecast is not None and not forecast.untrusted:
            horizon = now + workload.lead_time_s + workload.margin_s
            peak = forecast_peak(forecast, now, horizon, EXPECTED_QUANTILE)
        if peak is None:  # nothing to expect from: serving must have all it reserves
            replicas = max(planned, running)
        else:
            need = math.ceil(peak / workload.capacity_rps - 1e-9)
            need = min(max(need, workload.min_replicas), workload.max_replicas)
            replicas = min(max(need, running), max(planned, running))
        expected += replicas * requests
    capacity = np.asarray(inputs.cluster.allocatable, dtype=np.float64).sum(axis=0)
    placed = np.asarray(decision.node_usage, dtype=np.float64).reshape(-1, 3).sum(axis=0)
    other = np.maximum(placed - placed_serving, 0.0)
    return ServingNeedParts(capacity, reserved, expected, other)
