"""`plan(inputs, state, now) -> (decision, new_state)`: the planner's model
(docs/concepts/index.md, "The planner's model"), one decision after the other: serving
(serving/), training (training/), then the room serving holds but does not use lent to
training (lending/). Pure: no clock, no I/O; the same inputs, state and `now` give the same
decision, so every decision can be replayed."""

from __future__ import annotations

import numpy as np

from tideshift.services.planner.core.lending import (
    BatchPlan,
    hold_released_room,
    lend_gpu_room,
    plan_on_batch_room,
    split_batch,
)
from tideshift.services.planner.core.model import Decision, PlanInputs, PlanState
from tideshift.services.planner.core.packing import (
    cluster_entries,
    managed_targets,
    reserve_pending_companions,
)
from tideshift.services.planner.core.serving import place_serving, size_serving
from tideshift.services.planner.core.training import (
    expected_reclaim,
    plan_training,
    queue_finite_jobs,
)

# The safe-mode announcement while the watcher is silent.
STALE_CLUSTER = "cluster view stale: holding serving scale-down, not growing training"


def plan(inputs: PlanInputs, state: PlanState, now: float) -> tuple[Decision, PlanState]:
    managed = set(managed_targets(inputs))
    # Batch jobs hold no requests: everything but step 5 plans without them.
    inputs, batch_inputs = split_batch(inputs)
    entries = cluster_entries(inputs)
    fallbacks = [STALE_CLUSTER] if inputs.cluster_stale else []

    # 1. Serving: replicas from the forecast, scale-down only through the stabilisation
    #    window; the GPU replicas above what demand and the forecast need lent to finite GPU
    #    jobs short of GPUs; then placed per node (free room first, then room trainers give
    #    back).
    sized = size_serving(inputs, state, now, entries.row_totals)
    serving = lend_gpu_room(inputs, sized, now)
    fallbacks += serving.fallbacks
    usage, serving_infeasible = place_serving(inputs, entries, serving.desired)

    # Without a fresh view of the cluster or of some serving demand, training must not take
    # capacity serving might need: it keeps what it has but does not grow.
    growth_frozen = inputs.cluster_stale or bool(serving.fallbacks)

    # 2-4. Training, tier by tier (higher priority first): what the tiers above leave goes to
    #      weighted dominant-resource-fair shares, gangs all or nothing, packed per node,
    #      within the churn limits.
    #      Room serving releases waits one plan while batch trainers may stand on it.
    if batch_inputs.jobs:
        usage = hold_released_room(inputs, entries, usage)
    #      Finite CPU jobs not yet started wait while starting them costs the jobs ahead
    #      more than it brings; the others plan in the room left, the parameter servers still
    #      waiting for a node reserved.
    inputs, entries, admission = queue_finite_jobs(
        inputs, usage, entries, state.job_queued_since, now
    )
    free = reserve_pending_companions(inputs, entries, inputs.cluster.allocatable - usage)
    #      Growth only into room serving is expected to keep long enough to pay its restarts:
    #      priced on serving as sized (room lent to GPU jobs is not taken from the others).
    reclaim = expected_reclaim(
        inputs.serving,
        inputs.forecasts,
        sized.desired,
        {d.target: d.headroom.rise_ratio for d in sized.decisions if d.headroom is not None},
        now=now,
        config=inputs.config,
    )
    grew_at = {target: t for target, t in state.job_grew_at.items() if target in managed}
    training = plan_training(
        inputs, entries, free, grew_at, reclaim=reclaim, growth_frozen=growth_frozen, now=now
    )

    # 5. Batch jobs on what serving reserves but does not use (and what no request took):
    #    planned after serving, so serving never waits for them, and shrunk first when
    #    serving's usage rises.
    batch = BatchPlan((), (), training.grew_at, {})
    if batch_inputs.jobs:
        batch = plan_on_batch_room(
            inputs,
            batch_inputs,
            entries,
            state,
            serving.desired,
            requested=inputs.cluster.allocatable - training.free,
            serving_requested=usage - entries.fixed,
            grew_at=training.grew_at,
            growth_frozen=growth_frozen,
            now=now,
        )

    decision = Decision(
        (
            *serving.decisions,
            *admission.note(training.decisions),
            *admission.queued,
            *batch.decisions,
        ),
        (*serving_infeasible, *training.infeasible, *batch.infeasible),
        tuple(fallbacks),
        np.asarray(inputs.cluster.allocatable - training.free),
    )
    new_state = PlanState(
        serving_history={k: v for k, v in serving.history.items() if k in managed},
        serving_seen_since={k: v for k, v in serving.seen_since.items() if k in managed},
        serving_misses={k: v for k, v in serving.misses.items() if k in managed},
        job_grew_at=batch.grew_at,
        batch_room=batch.steady,
        job_queued_since=admission.since,
    )
    return decision, new_state
