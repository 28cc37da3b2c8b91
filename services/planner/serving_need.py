"""The `ServingNeed` a plan publishes beside its `PlanDecided` (core/lending/serving_need.py
decides the figures): what the executor lends to Kueue from."""

from __future__ import annotations

from datetime import UTC, datetime

from tideshift.events.models import Resources, ServingNeed
from tideshift.services.planner.core.lending.serving_need import serving_need
from tideshift.services.planner.core.model import Decision, FloatArray, PlanInputs


def _resources(amount: FloatArray) -> Resources:
    cpu, memory, gpu = (max(float(x), 0.0) for x in amount)
    return Resources(cpu=cpu, memory=memory, gpu=int(gpu + 0.5))


def serving_need_event(
    inputs: PlanInputs, decision: Decision, *, plan_id: str, policy: str, now: float
) -> ServingNeed:
    parts = serving_need(inputs, decision, now)
    return ServingNeed(
        plan_id=plan_id,
        policy=policy,
        decided_at=datetime.fromtimestamp(now, UTC),
        capacity=_resources(parts.capacity),
        reserved=_resources(parts.reserved),
        expected=_resources(parts.expected),
        other=_resources(parts.other),
    )
