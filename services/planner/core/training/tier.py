"""Training, one priority tier at a time, read top to bottom: which trainers keep their nodes,
the tier's fair shares (`shares.TierSolver`), how far rebalancing goes, which shrinks wait and
which growth pays its restarts (the churn limits), then each job's decision and its words.
Pure; no I/O.

Churn: a change of a job's trainers costs it a restart (`TrainingJob.restart_cost_s` without
progress), so a trainer moved between two jobs costs two. Rebalancing lifts the jobs below
their share to `rebalance_floor` of it only when those moves buy more work over the next
planning horizon (`release_horizon_s`, how long room serving releases is planned to stay)
than their restarts cost; otherwise trainers move only to let a newcomer's gang in. A running
job grows only when its growth pays its restart the same way, and growth into room serving is
expected to take back (`lifetime.Reclaim`) only when it pays its two restarts before then.
Work is weighted by what a trainer holds (its dominant share: a GPU trainer's step is worth
more), each job's throughput being trainers ** `speedup_exponent`, as `tideshift simulate`
counts it. The solver's state is never edited: each step returns new values."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from tideshift.services.core.constants import EPS
from tideshift.services.planner.core.model import (
    BoolArray,
    FloatArray,
    Infeasible,
    IntArray,
    PlanInputs,
    PolicyConfig,
    Target,
    TargetDecision,
    TrainingJob,
    Vector,
)
from tideshift.services.planner.core.packing import (
    ROOM_SLACK,
    ClusterEntries,
    node_sums,
)
from tideshift.services.planner.core.training.lifetime import Reclaim
from tideshift.services.planner.core.training.shares import (
    Bounds,
    HoldingSolver,
    TierJob,
    TierSolver,
)


@dataclass(frozen=True, slots=True, eq=False)
class TierPlan:
    decisions: tuple[TargetDecision, ...]
    infeasible: tuple[Infeasible, ...]
    free: FloatArray  # what is left for lower tiers
    grew_at: dict[Target, float]


def plan_training(
    inputs: PlanInputs,
    entries: ClusterEntries,
    free: FloatArray,
    grew_at: dict[Target, float],
    *,
    reclaim: Reclaim,
    growth_frozen: bool,
    now: float,
) -> TierPlan:
    """Every tier's training jobs, higher priority first, each on what the tiers above left;
    growth only into room serving is expected to keep long enough to pay its restarts
    (`reclaim`)."""
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


def tier_priorities(inputs: PlanInputs) -> list[int]:
    return sorted({job.priority for job in inputs.jobs}, reverse=True)


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
        Infeasible(jobs[i].job.target, _unplaced_trainers(count))
        for i, count in enumerate(unplaced.tolist())
        if count > 0
    ]
    return TierPlan(tuple(decisions), tuple(infeasible), left, new_grew)


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


@dataclass(frozen=True, slots=True)
class _Tier:
    jobs: list[TierJob]
    solver: TierSolver
    forced: dict[int, int]  # local job -> trainers serving or a higher tier takes


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
    solver = HoldingSolver(
        tier_jobs,
        free - node_sums(local_node, kept, local_request, free.shape[0]),
        allocatable=view_total,
        entry_job=local_job[present],
        entry_node=local_node[present],
        entry_kept=kept[present],
    )
    return _Tier(tier_jobs, solver, forced)


def contended_resources(requests: FloatArray) -> BoolArray:
    """The resources two or more of a tier's jobs request, (jobs, 3) -> (3,); all of them when
    none is. Fairness is about what jobs compete for: GPUs only one job can use are no share
    taken from the others, and counting them would leave them idle to give CPU jobs cores."""
    contended: BoolArray = (requests > 0).sum(axis=0) >= 2
    return contended if contended.any() else np.ones(requests.shape[1], dtype=np.bool_)


def dominant_share(request: FloatArray, total: FloatArray, counted: BoolArray) -> float:
    """One trainer's largest share of any `counted` resource of the cluster."""
    shares = request[counted] / np.maximum(total[counted], EPS)
    return float(max(shares.max(initial=0.0), EPS))


def _kept(
    free: FloatArray, job: IntArray, node: IntArray, count: IntArray, request: FloatArray
) -> IntArray:
    """Per entry, the trainers that still fit on their node. Per overflowing node, in job
    order: an entry keeps what fits after the earlier entries on that node (counted in full:
    conservative if one was clipped)."""
    kept = count.copy()
    overflow = np.any(free - node_sums(node, count, request, free.shape[0]) < -ROOM_SLACK, axis=1)
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
        ratio = np.where(requests > 0, np.floor((room + ROOM_SLACK) / requests), np.inf)
    kept[on_overflow] = np.clip(ratio.min(axis=1), 0, count[on_overflow]).astype(np.int64)
    return kept


def _defer_growth(
    solver: TierSolver,
    counts: list[int],
    skip: set[int],
    config: PolicyConfig,
    reclaim: Reclaim | None,
) -> tuple[list[int], dict[int, str]]:
    """The growth that waits (`defer_small_growth`, below), priced against the room the tier
    leaves free (aggregate) with `counts`."""
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
            reason = _gang_excluded(job, growth_frozen=growth_frozen)
            infeasible.append(Infeasible(job.target, reason))
            desired = 0
        elif i in held:
            reason = held[i]
        elif i in forced and desired <= item.kept_total:
            reason = _forced_off(forced[i], desired)
        else:
            stale_cap = growth_frozen and desired >= bounds[i][1]
            reason = _fair_share_reason(tier, job, desired, item.dominant, stale_cap=stale_cap)
        decisions.append(TargetDecision(job.target, "training", item.current, desired, reason))
        final[i] = desired
    return decisions, infeasible, final


# ---- churn: how far rebalancing goes, which shrinks wait, which growth pays ------------------

# Bisection steps over how far above its fair share a job may stay (each one admit + fill).
_REBALANCE_STEPS = 8


def _held_share(item: TierJob, total: FloatArray) -> float:
    """One trainer's largest share of any resource of the cluster (`total`), GPUs included
    even when no other job wants them: what the trainer holds, as the simulator weighs work."""
    shares = np.divide(item.request, total, out=np.zeros(3), where=total > 0)
    return float(shares.max())


def _job_rate(item: TierJob, trainers: int, total: FloatArray) -> float:
    """A job's weighted work per second with `trainers` trainers."""
    return _held_share(item, total) * math.pow(trainers, item.job.speedup_exponent)


def change_gain(
    jobs: Sequence[TierJob],
    before: Sequence[int],
    after: Sequence[int],
    *,
    horizon_s: float,
    total: FloatArray,
) -> float:
    """Weighted work over the next `horizon_s` with `after` trainers rather than `before`,
    every job whose count changes losing its restart: positive when the changes pay."""
    gain = 0.0
    for item, old, new in zip(jobs, before, after, strict=True):
        if new != old:
            restarted = max(horizon_s - item.job.restart_cost_s, 0.0)
            gain += restarted * _job_rate(item, new, total) - horizon_s * _job_rate(
                item, old, total
            )
    return gain


def growth_gain(
    rate_before: float, rate_after: float, *, lifetime_s: float, cost_s: float
) -> float:
    """Work a growth buys over the room's `lifetime_s`, less its two restarts (one to grow,
    one when serving takes the room back): positive when the growth pays."""
    return (lifetime_s - cost_s) * rate_after - (lifetime_s + cost_s) * rate_before


@dataclass(frozen=True, slots=True)
class _Rebalance:
    """A tier's counts after partial rebalancing: the bounds that pin each job kept above its
    fair share, the jobs whose gangs stay out, and why those jobs keep more."""

    counts: list[int]
    bounds: tuple[tuple[int, int], ...]
    excluded: set[int]
    reasons: dict[int, str]


def rebalance_partly(
    solver: TierSolver,
    order: list[int],
    bounds: Bounds,
    fair: Sequence[int],
    excluded: set[int],
    *,
    config: PolicyConfig,
) -> _Rebalance:
    """Jobs above their fair share give back only what lifts every other job to
    `config.rebalance_floor` of its share (and keeps what each keeps), and only when those
    moves pay their restarts over the horizon; otherwise only what lets a newcomer's gang in.
    All above-share jobs stay within the same multiple `level` of their share, the highest
    level that still does it (bisection). A newcomer gets its floor of the share at once, the
    rest as room frees up."""
    jobs = solver.jobs
    admitted = [i for i in order if i not in excluded]
    above = [i for i in admitted if fair[i] < jobs[i].kept_total]
    unchanged = _Rebalance(list(fair), tuple(bounds), set(excluded), {})
    if not above or config.rebalance_floor >= 1:
        return unchanged
    below = [j for j in admitted if j not in above]
    floor = {
        j: min(
            fair[j],
            max(
                jobs[j].kept_total,
                jobs[j].job.floor,
                math.ceil(config.rebalance_floor * fair[j] - EPS),
            ),
        )
        for j in below
    }
    at_floor = _Levels(solver, order, bounds, fair, excluded, floor, above, config).highest()
    if at_floor is None:
        return unchanged
    gang = {j: min(fair[j], max(jobs[j].kept_total, jobs[j].job.floor)) for j in below}
    if gang == floor:
        return at_floor
    gang_only = _Levels(solver, order, bounds, fair, excluded, gang, above, config).highest()
    if gang_only is None:
        return at_floor
    total = solver.allocatable.sum(axis=0)
    return _worth_moving(jobs, gang_only, at_floor, fair=fair, total=total, config=config)


def _worth_moving(
    jobs: Sequence[TierJob],
    gang_only: _Rebalance,
    at_floor: _Rebalance,
    *,
    fair: Sequence[int],
    total: FloatArray,
    config: PolicyConfig,
) -> _Rebalance:
    """The floor's moves when what they buy over the horizon beyond letting the gangs in
    exceeds their restarts; else the gangs only, saying so (the loss in percent of the
    tier's work over the horizon)."""
    horizon = config.release_horizon_s
    kept = [item.kept_total for item in jobs]
    extra = change_gain(jobs, kept, at_floor.counts, horizon_s=horizon, total=total) - change_gain(
        jobs, kept, gang_only.counts, horizon_s=horizon, total=total
    )
    if extra > 0:
        return at_floor
    work = horizon * sum(
        _job_rate(item, count, total) for item, count in zip(jobs, kept, strict=True)
    )
    loss = -extra / work if work > 0 else 0.0
    why = {
        i: f"keeps {gang_only.counts[i]} above its fair share {fair[i]}: lifting the others to "
        f"{config.rebalance_floor:.0%} of their share would not pay its restarts ({loss:.1%} "
        f"less of the tier's work over the next {horizon:.0f} s)"
        for i in gang_only.reasons
    }
    return _Rebalance(gang_only.counts, gang_only.bounds, gang_only.excluded, why)


@dataclass(frozen=True, slots=True)
class _Levels:
    """One tier's partial rebalancing, tried at a given level of the above-share jobs."""

    solver: TierSolver
    order: list[int]
    bounds: Bounds
    fair: Sequence[int]
    excluded: set[int]
    required: dict[int, int]  # jobs at or below their share: the trainers each must reach
    above: list[int]  # jobs above their share
    config: PolicyConfig

    def highest(self) -> _Rebalance | None:
        """The outcome at the highest level that still lifts every job to what it requires."""
        top = max(self.solver.jobs[i].kept_total / self.fair[i] for i in self.above)
        best = self.solve(top)
        if best is not None:
            return best
        low, high = 1.0, top
        for _ in range(_REBALANCE_STEPS):
            middle = (low + high) / 2
            outcome = self.solve(middle)
            if outcome is None:
                high = middle
            else:
                low, best = middle, outcome
        return best

    def solve(self, level: float) -> _Rebalance | None:
        """Every above-share job kept at `level` x its share (at most what it keeps); None
        when that leaves a job out or below what it requires."""
        jobs, bounds, fair = self.solver.jobs, self.bounds, self.fair
        pinned = list(bounds)
        for j in self.required:  # a job at or below its share keeps what it keeps
            pinned[j] = (max(bounds[j][0], min(jobs[j].kept_total, fair[j])), bounds[j][1])
        for i in self.above:
            keep = min(
                jobs[i].kept_total, bounds[i][1], max(fair[i], math.ceil(level * fair[i] - EPS))
            )
            pinned[i] = (keep, keep)
        base, out = self.solver.admit(self.order, pinned)
        if not out <= self.excluded:
            return None
        counts = self.solver.fill([i for i in self.order if i not in out], base, pinned)
        if any(counts[j] < need for j, need in self.required.items()):
            return None
        why = {
            i: _above_fair_share(counts[i], fair[i], self.config)
            for i in self.above
            if counts[i] > fair[i]
        }
        return _Rebalance(counts, tuple(pinned), set(out), why)


@dataclass(frozen=True, slots=True)
class _Holds:
    """Jobs held this step (index -> reason), the bounds that pin them, and which holds are
    tolerance skips (released when they would keep a gang out)."""

    reasons: dict[int, str]
    bounds: tuple[tuple[int, int], ...]
    tolerance: frozenset[int]


def limit_shrinks(
    jobs: Sequence[TierJob],
    bounds: Bounds,
    ideal: Sequence[int],
    admitted: Sequence[int],
    *,
    grew_at: Mapping[Target, float],
    now: float,
    config: PolicyConfig,
) -> _Holds:
    """Hold shrinks of jobs that grew too recently or shrink too little; cap the removals per
    step (largest shrinks first). A held job is pinned at what it keeps."""
    held: dict[int, str] = {}
    tolerance: set[int] = set()
    pinned = list(bounds)
    budget = config.max_trainer_removals_per_step
    shrinking = sorted(
        (i for i in admitted if ideal[i] < jobs[i].kept_total),
        key=lambda i: ideal[i] - jobs[i].kept_total,
    )
    for i in shrinking:
        item = jobs[i]
        removal = item.kept_total - ideal[i]
        grew = grew_at.get(item.job.target)
        if grew is not None and now - grew < config.min_trainer_lifetime_s:
            held[i] = _shrink_deferred(ideal[i], now - grew, config)
        elif removal <= max(1, config.shrink_tolerance * item.kept_total) and (
            ideal[i] >= bounds[i][0]
        ):
            held[i] = _shrink_skipped(removal)
            tolerance.add(i)
        else:
            allowed = min(removal, budget)
            budget -= allowed
            if allowed < removal:
                held[i] = _removals_capped(ideal[i], config)
                pinned[i] = (item.kept_total - allowed, item.kept_total - allowed)
    for i in held:
        low, high = pinned[i]
        if low != high:
            keep = min(jobs[i].kept_total, high)
            pinned[i] = (keep, keep)
    return _Holds(held, tuple(pinned), frozenset(tolerance))


def release_tolerance(holds: _Holds, bounds: Bounds) -> _Holds:
    """The holds without the tolerance skips: those jobs get their own bounds back."""
    released = tuple(
        bounds[i] if i in holds.tolerance else pinned for i, pinned in enumerate(holds.bounds)
    )
    kept = {i: why for i, why in holds.reasons.items() if i not in holds.tolerance}
    return _Holds(kept, released, frozenset())


def defer_small_growth(
    jobs: Sequence[TierJob],
    counts: Sequence[int],
    *,
    skip: set[int],
    total: FloatArray,
    config: PolicyConfig,
    reclaim: Reclaim | None = None,
    leftover: FloatArray | None = None,
) -> tuple[list[int], dict[int, str]]:
    """Small growth of a running job waits until it is worth a membership change: each change
    costs the job a restart, and serving's jitter would otherwise make trainers come and go
    every few minutes. Growth that does not pay its restart over the horizon waits too, and
    growth into room serving is expected to take back (`reclaim`, beyond the `leftover` room
    `counts` leave free) is cut to what pays its two restarts before then. Small is in
    trainers and in what they hold of the cluster (`total`): one GPU of 16 is no jitter even
    when no other job wants GPUs. Later jobs (the newest) are cut first: the room they leave
    lasts longer for the others. Returns the counts and the reasons of the deferred jobs."""
    final = list(counts)
    deferred: dict[int, str] = {}
    room = _Room(reclaim or Reclaim.none(), np.zeros(3) if leftover is None else leftover.copy())
    for i in reversed(range(len(jobs))):
        item = jobs[i]
        growth = final[i] - item.current
        if i in skip or growth <= 0 or item.current < item.job.floor:
            continue
        # Small in trainers and in the cluster: one large trainer (a node's worth) is no jitter.
        if (
            growth <= max(1, config.grow_tolerance * item.current)
            and growth * _held_share(item, total) < config.grow_tolerance
        ):
            final[i], deferred[i] = item.current, _growth_deferred(growth)
        else:
            final[i], why = room.paying(item, growth, total=total, config=config)
            if why is not None:
                deferred[i] = why
        room.leftover += (counts[i] - final[i]) * item.request
    return final, deferred


@dataclass(slots=True)
class _Room:
    """The room a tier's plan leaves free (aggregate), and when serving takes it back."""

    reclaim: Reclaim
    leftover: FloatArray

    def lifetime(self, ungrown: int, item: TierJob) -> float | None:
        """How long the room lasts when `ungrown` of the job's new trainers wait."""
        return self.reclaim.lifetime(self.leftover + ungrown * item.request)

    def paying(
        self, item: TierJob, growth: int, *, total: FloatArray, config: PolicyConfig
    ) -> tuple[int, str | None]:
        """The job's count after the largest part of `growth` that pays: its restart over the
        horizon while no forecast sees serving take the room back, else its two restarts
        over the room's lifetime. The reason when the growth is cut."""
        cost, horizon = item.job.restart_cost_s, config.release_horizon_s
        part = next(
            (p for p in range(growth, 0, -1) if self._pays(item, growth, p, total, horizon)), 0
        )
        if part == growth:
            return item.current + part, None
        lifetime = self.lifetime(0, item)
        if lifetime is None:
            return item.current, (
                f"growth by {growth} deferred: {item.current + growth} trainers instead of "
                f"{item.current} do not pay a {cost:g} s restart over the next {horizon:.0f} s"
            )
        return item.current + part, _growth_into_reclaimed_room(growth, part, lifetime, cost)

    def _pays(
        self, item: TierJob, growth: int, part: int, total: FloatArray, horizon: float
    ) -> bool:
        """Whether growing by `part` of `growth` pays over the lifetime of the room it leaves."""
        lifetime = self.lifetime(growth - part, item)
        if lifetime is None:
            grown = [item.current + part]
            return change_gain([item], [item.current], grown, horizon_s=horizon, total=total) > 0
        before = _job_rate(item, item.current, total)
        after = _job_rate(item, item.current + part, total)
        return growth_gain(before, after, lifetime_s=lifetime, cost_s=item.job.restart_cost_s) > 0


# ---- the words of a tier's decisions --------------------------------------------------------


def _format_vector(vector: Vector) -> str:
    cpu, memory, gpu = vector
    text = f"{cpu:g} cpu, {memory / 2**30:g} GiB"
    return text + (f", {gpu:g} gpu" if gpu else "")


def _shrink_deferred(fair_share: int, since_growth_s: float, config: PolicyConfig) -> str:
    return (
        f"shrink to {fair_share} deferred: grew {since_growth_s:.0f} s ago "
        f"(minimum trainer lifetime {config.min_trainer_lifetime_s:.0f} s)"
    )


def _shrink_skipped(removal: int) -> str:
    return f"shrink by {removal} skipped (within tolerance, avoids flapping)"


def _removals_capped(fair_share: int, config: PolicyConfig) -> str:
    return (
        f"removals capped at {config.max_trainer_removals_per_step} per step "
        f"(fair share {fair_share})"
    )


def _above_fair_share(kept: int, fair_share: int, config: PolicyConfig) -> str:
    return (
        f"keeps {kept} above its fair share {fair_share}: every job has at least "
        f"{config.rebalance_floor:.0%} of its share, further moves are not worth their restarts"
    )


def _growth_deferred(growth: int) -> str:
    return f"growth by {growth} deferred (within tolerance, avoids flapping)"


def _growth_into_reclaimed_room(growth: int, kept: int, lifetime_s: float, cost_s: float) -> str:
    """Growth cut because serving is expected to take its room back before it pays."""
    head = f"growth by {growth} deferred" if kept == 0 else f"growth by {growth} cut to {kept}"
    return (
        f"{head}: serving is expected to take the room back in {lifetime_s:.0f} s, before "
        f"{'the growth pays its' if kept == 0 else 'more trainers pay their'} two {cost_s:g} s "
        "restarts"
    )


def _gang_excluded(job: TrainingJob, *, growth_frozen: bool) -> str:
    reason = (
        f"gang minimum {job.floor} x {_format_vector(job.trainer_requests)} "
        "does not fit the free capacity: 0 trainers (all or nothing)"
    )
    return reason + ("; inputs stale, not growing" if growth_frozen else "")


def _forced_off(count: int, fair_share: int) -> str:
    return (
        f"{count} trainer(s) must leave nodes that serving or a higher tier needs; "
        f"fair share {fair_share}"
    )


def _fair_share_reason(
    tier: int, job: TrainingJob, desired: int, dominant: float, *, stale_cap: bool
) -> str:
    share = desired * dominant / job.weight
    reason = (
        f"tier {tier}: weighted dominant share {share:.3f} "
        f"(weight {job.weight:g}) -> {desired} trainers in "
        f"[{job.floor}, {job.max_trainers}]"
    )
    if job.remaining_work is not None and desired > 0:
        left = job.remaining_work / desired**job.speedup_exponent
        reason += (
            f"; finite job, about {left:.0f} s of work left at {desired} trainers (finite "
            "jobs share the room beyond the gangs shortest-remaining-first)"
        )
    if desired >= job.max_trainers:
        reason += " (at max)"
    return reason + ("; inputs stale, not growing" if stale_cap else "")


def _unplaced_trainers(count: int) -> str:
    return f"{count} trainer(s) fit on no node yet (per-node packing)"
