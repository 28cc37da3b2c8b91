"""`plan(inputs, state, now) -> (decision, new_state)`: the planner's model (docs/DESIGN.md, "The
planner's model") as an outline. Pure: no clock, no I/O; the same inputs, state and `now` give
the same decision, so every decision can be replayed."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from tideshift.services.planner.core import reasons
from tideshift.services.planner.core.admission import Admission, queue_finite_jobs
from tideshift.services.planner.core.batch import (
    BatchPlan,
    batch_room,
    hold_released_room,
    plan_batch,
    serving_busy,
    serving_staying,
    split_batch,
)
from tideshift.services.planner.core.gpu_loan import lend_gpu_room
from tideshift.services.planner.core.lifetime import expected_reclaim
from tideshift.services.planner.core.model import (
    Decision,
    FloatArray,
    Infeasible,
    PlanInputs,
    PlanState,
    Target,
    TargetDecision,
)
from tideshift.services.planner.core.packing import (
    ClusterEntries,
    cluster_entries,
    managed_targets,
    reserve_pending_companions,
)
from tideshift.services.planner.core.serving import ServingPlan, place_serving, size_serving
from tideshift.services.planner.core.training import (
    TierPlan,
    Trainers,
    plan_tier,
    tier_priorities,
)


def plan(inputs: PlanInputs, state: PlanState, now: float) -> tuple[Decision, PlanState]:
    managed = set(managed_targets(inputs))
    # Batch jobs hold no requests: everything but step 5 plans without them.
    inputs, batch_inputs = split_batch(inputs)
    entries = cluster_entries(inputs)
    fallbacks = [reasons.STALE_CLUSTER] if inputs.cluster_stale else []

    # 1. Serving: replicas from the forecast, scale-down only through the stabilisation
    #    window; then placed per node (free room first, then room trainers give back).
    sized, serving = _size_serving(inputs, state, now, entries)
    fallbacks += serving.fallbacks
    usage, serving_infeasible = place_serving(inputs, entries, serving.desired)

    # Without a fresh view of the cluster or of some serving demand, training must not take
    # capacity serving might need: it keeps what it has but does not grow.
    growth_frozen = _growth_frozen(inputs, serving)

    # 2-4. Training, tier by tier (higher priority first): what the tiers above leave goes to
    #      weighted dominant-resource-fair shares, gangs all or nothing, packed per node,
    #      within the churn limits.
    #      Room serving releases waits one plan while batch trainers may stand on it.
    if batch_inputs.jobs:
        usage = hold_released_room(inputs, entries, usage)
    inputs, entries, adm, free = _admit(inputs, usage, entries, state, now)
    grew_at = {target: t for target, t in state.job_grew_at.items() if target in managed}
    training = _plan_training(inputs, entries, free, grew_at, sized, now=now)

    # 5. Batch jobs on what serving reserves but does not use (and what no request took):
    #    planned after serving, so serving never waits for them, and shrunk first when
    #    serving's usage rises.
    batch = BatchPlan((), (), training.grew_at, {})
    if batch_inputs.jobs:
        batch = _plan_on_batch_room(
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
        (*serving.decisions, *adm.note(training.decisions), *adm.queued, *batch.decisions),
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
        job_queued_since=adm.since,
    )
    return decision, new_state


def _size_serving(
    inputs: PlanInputs, state: PlanState, now: float, entries: ClusterEntries
) -> tuple[ServingPlan, ServingPlan]:
    """Serving as sized, and as placed: the GPU replicas above what demand and the forecast
    need lent to finite GPU jobs short of GPUs (policy/gpu_loan.py). Training prices the room
    serving may reclaim on the first: room lent to GPU jobs is not taken from the others."""
    sized = size_serving(inputs, state, now, entries.row_totals)
    return sized, lend_gpu_room(inputs, sized, now)


def _admit(
    inputs: PlanInputs, usage: FloatArray, entries: ClusterEntries, state: PlanState, now: float
) -> tuple[PlanInputs, ClusterEntries, Admission, FloatArray]:
    """The inputs without the finite jobs that wait (policy/admission.py), what admission
    decided, and the room the others plan in (the parameter servers still waiting for a node
    reserved)."""
    inputs, entries, admission = queue_finite_jobs(
        inputs, usage, entries, state.job_queued_since, now
    )
    free = reserve_pending_companions(inputs, entries, inputs.cluster.allocatable - usage)
    return inputs, entries, admission, free


def _growth_frozen(inputs: PlanInputs, serving: ServingPlan) -> bool:
    """Whether training keeps what it has but does not grow (stale cluster or demand)."""
    return inputs.cluster_stale or bool(serving.fallbacks)


def _plan_training(
    inputs: PlanInputs,
    entries: ClusterEntries,
    free: FloatArray,
    grew_at: dict[Target, float],
    serving: ServingPlan,
    *,
    now: float,
) -> TierPlan:
    """Every tier's training jobs, higher priority first, each on what the tiers above left;
    growth only into room serving is expected to keep long enough to pay its restarts."""
    reclaim = expected_reclaim(
        inputs.serving,
        inputs.forecasts,
        serving.desired,
        {d.target: d.headroom.rise_ratio for d in serving.decisions if d.headroom is not None},
        now=now,
        config=inputs.config,
    )
    growth_frozen = _growth_frozen(inputs, serving)
    decisions: list[TargetDecision] = []
    infeasible: list[Infeasible] = []
    trainers = Trainers.of(inputs, entries)
    for tier in tier_priorities(inputs):
        outcome = plan_tier(
            inputs,
            trainers,
            tier,
            free,
            grew_at=grew_at,
            growth_frozen=growth_frozen,
            now=now,
            reclaim=reclaim,
        )
        decisions += outcome.decisions
        infeasible += outcome.infeasible
        free, grew_at = outcome.free, outcome.grew_at
    return TierPlan(tuple(decisions), tuple(infeasible), free, grew_at)


def _plan_on_batch_room(
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
    return plan_batch(
        batch_inputs,
        room_now,
        room_ahead=room_ahead,
        steady=state.batch_room,
        grew_at=grew_at,
        growth_frozen=growth_frozen,
        now=now,
    )
