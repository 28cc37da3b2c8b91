"""`plan(inputs, state, now) -> (decision, new_state)`: the planner's model (DESIGN.md, "The
planner's model") as an outline. Pure: no clock, no I/O; the same inputs, state and `now` give
the same decision, so every decision can be replayed."""

from __future__ import annotations

import numpy as np

from tideshift.services.planner.policy.batch import (
    batch_room,
    hold_released_room,
    plan_batch,
    serving_busy,
    serving_staying,
    split_batch,
)
from tideshift.services.planner.policy.model import (
    Decision,
    Infeasible,
    PlanInputs,
    PlanState,
    SteadyRoom,
    TargetDecision,
)
from tideshift.services.planner.policy.packing import (
    cluster_entries,
    managed_targets,
    reserve_pending_companions,
)
from tideshift.services.planner.policy.serving import place_serving, size_serving
from tideshift.services.planner.policy.training import Trainers, plan_tier, tier_priorities

STALE_CLUSTER = "cluster view stale: holding serving scale-down, not growing training"


def plan(inputs: PlanInputs, state: PlanState, now: float) -> tuple[Decision, PlanState]:
    managed = set(managed_targets(inputs))
    # Batch jobs hold no requests: everything but step 5 plans without them.
    inputs, batch_inputs = split_batch(inputs)
    entries = cluster_entries(inputs)
    fallbacks = [STALE_CLUSTER] if inputs.cluster_stale else []

    # 1. Serving: replicas from the forecast, scale-down only through the stabilisation
    #    window; then placed per node (free room first, then room trainers give back).
    serving = size_serving(inputs, state, now, entries.row_totals)
    fallbacks += serving.fallbacks
    usage, serving_infeasible = place_serving(inputs, entries, serving.desired)
    decisions: list[TargetDecision] = list(serving.decisions)
    infeasible: list[Infeasible] = list(serving_infeasible)

    # Without a fresh view of the cluster or of some serving demand, training must not take
    # capacity serving might need: it keeps what it has but does not grow.
    growth_frozen = inputs.cluster_stale or bool(serving.fallbacks)

    # 2-4. Training, tier by tier (higher priority first): what the tiers above leave goes to
    #      weighted dominant-resource-fair shares, gangs all or nothing, packed per node,
    #      within the churn limits.
    #      Room serving releases waits one plan while batch trainers may stand on it.
    if batch_inputs.jobs:
        usage = hold_released_room(inputs, entries, usage)
    free = reserve_pending_companions(inputs, entries, inputs.cluster.allocatable - usage)
    grew_at = {target: t for target, t in state.job_grew_at.items() if target in managed}
    trainers = Trainers.of(inputs, entries)
    for tier in tier_priorities(inputs):
        outcome = plan_tier(
            inputs, trainers, tier, free, grew_at=grew_at, growth_frozen=growth_frozen, now=now
        )
        decisions += outcome.decisions
        infeasible += outcome.infeasible
        free, grew_at = outcome.free, outcome.grew_at

    # 5. Batch jobs on what serving reserves but does not use (and what no request took):
    #    planned after serving, so serving never waits for them, and shrunk first when
    #    serving's usage rises.
    batch_steady: dict[str, SteadyRoom] = {}
    if batch_inputs.jobs:
        requested = inputs.cluster.allocatable - free
        # Growth only into room the forecast keeps for as long as growth waits for it.
        busy_ahead = serving_busy(
            inputs, serving.desired, now, beyond_s=inputs.config.batch_grow_after_s
        )
        busy_now = serving_busy(inputs, serving.desired, now, ahead=False)
        serving_requested = usage - entries.fixed
        staying = serving_staying(inputs, entries, serving.desired)
        room_now, room_ahead = (
            batch_room(
                inputs, requested, serving_requested=serving_requested, staying=staying, busy=busy
            )
            for busy in (busy_now, busy_ahead)
        )
        batch = plan_batch(
            batch_inputs,
            room_now,
            room_ahead=room_ahead,
            steady=state.batch_room,
            grew_at=grew_at,
            growth_frozen=growth_frozen,
            now=now,
        )
        decisions += batch.decisions
        infeasible += batch.infeasible
        grew_at = batch.grew_at
        batch_steady = batch.steady

    decision = Decision(
        tuple(decisions),
        tuple(infeasible),
        tuple(fallbacks),
        np.asarray(inputs.cluster.allocatable - free),
    )
    new_state = PlanState(
        serving_history={k: v for k, v in serving.history.items() if k in managed},
        serving_seen_since={k: v for k, v in serving.seen_since.items() if k in managed},
        serving_misses={k: v for k, v in serving.misses.items() if k in managed},
        job_grew_at=grew_at,
        batch_room=batch_steady,
    )
    return decision, new_state
