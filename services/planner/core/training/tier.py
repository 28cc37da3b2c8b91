"""Training, one priority tier at a time: which trainers keep their nodes, the tier's fair
shares (tiers.py), the churn limits (churn.py), and the tier's decisions. Pure; no I/O."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from tideshift.services.planner.core import reasons
from tideshift.services.planner.core.churn import (
    defer_small_growth,
    limit_shrinks,
    rebalance_partly,
    release_tolerance,
)
from tideshift.services.planner.core.lifetime import Reclaim
from tideshift.services.planner.core.model import (
    FloatArray,
    Infeasible,
    IntArray,
    PlanInputs,
    PolicyConfig,
    Target,
    TargetDecision,
)
from tideshift.services.planner.core.packing import ClusterEntries, node_sums, slots_per_node
from tideshift.services.planner.core.tiers import (
    Bounds,
    TierJob,
    TierSolver,
    contended_resources,
    dominant_share,
)

# Rounds of holding the jobs that cannot take one more trainer and refilling the others.
_HOLD_ROUNDS = 3


@dataclass(frozen=True, slots=True, eq=False)
class Trainers:
    """Every job's bound trainers as entries (job, node, count), and each job's total."""

    job: IntArray
    node: IntArray
    count: IntArray
    bound: IntArray  # (jobs,)
    requests: FloatArray  # (jobs, 3)

    @classmethod
    def of(cls, inputs: PlanInputs, entries: ClusterEntries) -> Trainers:
        serving_count = len(inputs.serving)
        is_job = entries.row >= serving_count
        return cls(
            job=entries.row[is_job] - serving_count,
            node=entries.node[is_job],
            count=entries.count[is_job],
            bound=entries.row_totals[serving_count:],
            requests=np.array(
                [job.trainer_requests for job in inputs.jobs], dtype=np.float64
            ).reshape(-1, 3),
        )


@dataclass(frozen=True, slots=True, eq=False)
class TierPlan:
    decisions: tuple[TargetDecision, ...]
    infeasible: tuple[Infeasible, ...]
    free: FloatArray  # what is left for lower tiers
    grew_at: dict[Target, float]


@dataclass(frozen=True, slots=True)
class _Tier:
    jobs: list[TierJob]
    solver: TierSolver
    forced: dict[int, int]  # local job -> trainers serving or a higher tier takes


class _HoldingSolver(TierSolver):
    """The tier's solver, whose fill does not let a job that cannot take one more trainer
    anywhere (its GPUs are all taken, or no node has room for its shape) cap the others: the
    fair level is bounded by every resource in aggregate, so a GPU job short of GPUs held the
    CPU jobs at its level while their cores sat free (finite-jobs-gpu: medium gang jobs at
    their gang minimum for hours beside idle nodes). Such jobs are held at what they got and
    the others filled again."""

    def fill(self, admitted: Sequence[int], base: Sequence[int], bounds: Bounds) -> list[int]:
        counts = super().fill(admitted, base, bounds)
        held = list(bounds)
        for _ in range(_HOLD_ROUNDS):
            _, free, _ = self.place(counts)
            growing = [i for i in admitted if counts[i] < held[i][1]]
            stuck = [i for i in growing if not slots_per_node(free, self.jobs[i].request).any()]
            if not stuck or len(stuck) == len(growing):
                break
            for i in stuck:
                held[i] = (counts[i], counts[i])
            refilled = super().fill(admitted, base, held)
            if sum(refilled) <= sum(counts):
                break
            counts = refilled
        return counts


def tier_priorities(inputs: PlanInputs) -> list[int]:
    return sorted({job.priority for job in inputs.jobs}, reverse=True)


def _prepare(inputs: PlanInputs, trainers: Trainers, tier: int, free: FloatArray) -> _Tier:
    """The tier's jobs (running first, then by submission) and what each keeps: trainers stay
    where they are unless serving or a higher tier took their node; there, earlier jobs keep
    theirs first."""
    jobs = inputs.jobs
    members = [k for k, job in enumerate(jobs) if job.priority == tier]
    members.sort(
        key=lambda k: (int(trainers.bound[k]) < jobs[k].floor, jobs[k].submitted_at, jobs[k].target)
    )
    member_array = np.asarray(members, dtype=np.int64)
    to_local = np.full(len(jobs), -1, dtype=np.int64)
    to_local[member_array] = np.arange(len(members))
    in_tier = to_local[trainers.job] >= 0
    local_job = to_local[trainers.job[in_tier]]
    by_job = np.argsort(local_job, kind="stable")
    local_job = local_job[by_job]
    local_node = trainers.node[in_tier][by_job]
    local_count = trainers.count[in_tier][by_job]
    local_request = trainers.requests[member_array].reshape(-1, 3)[local_job]
    kept = _kept(free, local_job, local_node, local_count, local_request)
    kept_totals = np.bincount(local_job, weights=kept, minlength=len(members)).astype(np.int64)
    view_total = inputs.cluster.allocatable
    total = view_total.sum(axis=0) if view_total.shape[0] else np.zeros(3)
    tier_jobs: list[TierJob] = []
    forced: dict[int, int] = {}
    counted = contended_resources(trainers.requests[member_array].reshape(-1, 3))
    for local, k in enumerate(members):
        kept_total, bound_total = int(kept_totals[local]), int(trainers.bound[k])
        if kept_total < bound_total:
            forced[local] = bound_total - kept_total
        request = trainers.requests[k]
        current = inputs.current.get(jobs[k].target, bound_total)
        tier_jobs.append(
            TierJob(jobs[k], current, request, kept_total, dominant_share(request, total, counted))
        )
    present = kept > 0
    solver = _HoldingSolver(
        tier_jobs,
        free - node_sums(local_node, kept, local_request, free.shape[0]),
        allocatable=view_total,
        entry_job=local_job[present],
        entry_node=local_node[present],
        entry_kept=kept[present],
    )
    return _Tier(tier_jobs, solver, forced)


def _kept(
    free: FloatArray, job: IntArray, node: IntArray, count: IntArray, request: FloatArray
) -> IntArray:
    """Per entry, the trainers that still fit on their node. Per overflowing node, in job
    order: an entry keeps what fits after the earlier entries on that node (counted in full:
    conservative if one was clipped)."""
    kept = count.copy()
    overflow = np.any(free - node_sums(node, count, request, free.shape[0]) < -1e-6, axis=1)
    if not overflow.any():
        return kept
    on_overflow = np.flatnonzero(overflow[node])
    on_overflow = on_overflow[np.lexsort((job[on_overflow], node[on_overflow]))]
    nodes = node[on_overflow]
    requests = request[on_overflow]
    use = count[on_overflow][:, None] * requests
    running = np.cumsum(use, axis=0)
    first = np.r_[True, nodes[1:] != nodes[:-1]]
    group_start = np.maximum.accumulate(np.where(first, np.arange(len(nodes)), 0))
    before = running - use - (running[group_start] - use[group_start])
    room = free[nodes] - before
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = np.where(requests > 0, np.floor((room + 1e-6) / requests), np.inf)
    kept[on_overflow] = np.clip(ratio.min(axis=1), 0, count[on_overflow]).astype(np.int64)
    return kept


def plan_tier(
    inputs: PlanInputs,
    trainers: Trainers,
    tier: int,
    free: FloatArray,
    *,
    grew_at: Mapping[Target, float],
    growth_frozen: bool,
    now: float,
    reclaim: Reclaim | None = None,
) -> TierPlan:
    """Fair shares within the churn limits, then the tier's decisions and placement; growth
    priced against when serving is expected to take its room back (`reclaim`)."""
    prepared = _prepare(inputs, trainers, tier, free)
    jobs, solver, config = prepared.jobs, prepared.solver, inputs.config
    bounds = [(item.job.floor, _upper(item, growth_frozen=growth_frozen)) for item in jobs]
    order = list(range(len(jobs)))
    base, excluded = solver.admit(order, bounds)
    fair = solver.fill([i for i in order if i not in excluded], base, bounds)
    rebalance = rebalance_partly(solver, order, bounds, fair, excluded, config=config)
    excluded = rebalance.excluded
    holds = limit_shrinks(
        jobs,
        rebalance.bounds,
        rebalance.counts,
        [i for i in order if i not in excluded],
        grew_at=grew_at,
        now=now,
        config=config,
    )
    final = rebalance.counts
    if holds.reasons:
        base, held_excluded = solver.admit(order, holds.bounds)
        if len(held_excluded) > len(excluded) and holds.tolerance:
            # A tolerance hold would keep a gang out: release those holds.
            holds = release_tolerance(holds, rebalance.bounds)
            base, held_excluded = solver.admit(order, holds.bounds)
        final = solver.fill([i for i in order if i not in held_excluded], base, holds.bounds)
        excluded = held_excluded
    held = rebalance.reasons | holds.reasons
    final, deferred = _defer_growth(solver, final, excluded | set(held), config, reclaim)
    held.update(deferred)
    decisions, infeasible, final = _decide(
        tier,
        jobs,
        final,
        bounds=bounds,
        excluded=excluded,
        held=held,
        forced=prepared.forced,
        growth_frozen=growth_frozen,
    )
    new_grew = _grown(jobs, final, grew_at, now)
    _, left, unplaced = solver.place(final)
    infeasible += [
        Infeasible(jobs[i].job.target, reasons.unplaced_trainers(count))
        for i, count in enumerate(unplaced.tolist())
        if count > 0
    ]
    return TierPlan(tuple(decisions), tuple(infeasible), left, new_grew)


def _defer_growth(
    solver: TierSolver,
    counts: list[int],
    skip: set[int],
    config: PolicyConfig,
    reclaim: Reclaim | None,
) -> tuple[list[int], dict[int, str]]:
    """The growth that waits (churn.py), priced against the room the tier leaves free
    (aggregate) with `counts`."""
    change = np.asarray(counts, dtype=np.float64) - solver.kept_totals
    requests = np.array([item.request for item in solver.jobs], dtype=np.float64).reshape(-1, 3)
    return defer_small_growth(
        solver.jobs,
        counts,
        skip=skip,
        total=solver.allocatable.sum(axis=0),
        config=config,
        reclaim=reclaim,
        leftover=solver.base_free.sum(axis=0) - change @ requests,
    )


def _grown(
    jobs: Sequence[TierJob], final: Sequence[int], grew_at: Mapping[Target, float], now: float
) -> dict[Target, float]:
    """When each job last grew: `now` for those this plan grows (their shrink waits)."""
    new_grew = dict(grew_at)
    for item, desired in zip(jobs, final, strict=True):
        if desired > item.kept_total:
            new_grew[item.job.target] = now
    return new_grew


def _upper(item: TierJob, *, growth_frozen: bool) -> int:
    """A job's most trainers; without fresh inputs it keeps what it has but does not grow."""
    if growth_frozen:
        return min(item.job.max_trainers, max(item.current, item.kept_total))
    return item.job.max_trainers


def _decide(
    tier: int,
    jobs: list[TierJob],
    counts: list[int],
    *,
    bounds: list[tuple[int, int]],
    excluded: set[int],
    held: dict[int, str],
    forced: dict[int, int],
    growth_frozen: bool,
) -> tuple[list[TargetDecision], list[Infeasible], list[int]]:
    """Each job's decision and reason; jobs whose gang does not fit get 0."""
    decisions: list[TargetDecision] = []
    infeasible: list[Infeasible] = []
    final = list(counts)
    for i, item in enumerate(jobs):
        job, desired = item.job, final[i]
        if i in excluded and job.max_trainers > 0:
            reason = reasons.gang_excluded(job, growth_frozen=growth_frozen)
            infeasible.append(Infeasible(job.target, reason))
            desired = 0
        elif i in held:
            reason = held[i]
        elif i in forced and desired <= item.kept_total:
            reason = reasons.forced_off(forced[i], desired)
        else:
            stale_cap = growth_frozen and desired >= bounds[i][1]
            reason = reasons.fair_share(tier, job, desired, item.dominant, stale_cap=stale_cap)
        decisions.append(TargetDecision(job.target, "training", item.current, desired, reason))
        final[i] = desired
    return decisions, infeasible, final
