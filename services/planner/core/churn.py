"""Churn limits: which voluntary trainer removals (rebalancing, not forced by serving or a
higher tier) wait, are skipped or are capped this step, and which small growths wait. Pure
functions returning new values; the solver's state is never edited.

A change of a job's trainers costs it a restart (`TrainingJob.restart_cost_s` without
progress), so a trainer moved between two jobs costs two. Rebalancing lifts the jobs below
their share to `rebalance_floor` of it only when those moves buy more work over the next
planning horizon (`release_horizon_s`, how long room serving releases is planned to stay)
than their restarts cost; otherwise trainers move only to let a newcomer's gang in. A running
job grows only when its growth pays its restart the same way. Work is weighted by what a
trainer holds (its dominant share: a GPU trainer's step is worth more), each job's throughput
being trainers ** `speedup_exponent`, as `tideshift simulate` counts it."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from tideshift.services.planner.core import reasons
from tideshift.services.planner.core.lifetime import Reclaim, growth_gain
from tideshift.services.planner.core.model import FloatArray, PolicyConfig, Target
from tideshift.services.planner.core.tiers import Bounds, TierJob, TierSolver

# Bisection steps over how far above its fair share a job may stay (each one admit + fill).
_REBALANCE_STEPS = 8


def held_share(item: TierJob, total: FloatArray) -> float:
    """One trainer's largest share of any resource of the cluster (`total`), GPUs included
    even when no other job wants them: what the trainer holds, as the simulator weighs work."""
    shares = np.divide(item.request, total, out=np.zeros(3), where=total > 0)
    return float(shares.max())


def job_rate(item: TierJob, trainers: int, total: FloatArray) -> float:
    """A job's weighted work per second with `trainers` trainers."""
    return held_share(item, total) * math.pow(trainers, item.job.speedup_exponent)


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
            gain += restarted * job_rate(item, new, total) - horizon_s * job_rate(item, old, total)
    return gain


@dataclass(frozen=True, slots=True)
class Rebalance:
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
) -> Rebalance:
    """Jobs above their fair share give back only what lifts every other job to
    `config.rebalance_floor` of its share (and keeps what each keeps), and only when those
    moves pay their restarts over the horizon; otherwise only what lets a newcomer's gang in.
    All above-share jobs stay within the same multiple `level` of their share, the highest
    level that still does it (bisection). A newcomer gets its floor of the share at once, the
    rest as room frees up."""
    jobs = solver.jobs
    admitted = [i for i in order if i not in excluded]
    above = [i for i in admitted if fair[i] < jobs[i].kept_total]
    unchanged = Rebalance(list(fair), tuple(bounds), set(excluded), {})
    if not above or config.rebalance_floor >= 1:
        return unchanged
    below = [j for j in admitted if j not in above]
    floor = {
        j: min(
            fair[j],
            max(
                jobs[j].kept_total,
                jobs[j].job.floor,
                math.ceil(config.rebalance_floor * fair[j] - 1e-9),
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
    gang_only: Rebalance,
    at_floor: Rebalance,
    *,
    fair: Sequence[int],
    total: FloatArray,
    config: PolicyConfig,
) -> Rebalance:
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
        job_rate(item, count, total) for item, count in zip(jobs, kept, strict=True)
    )
    loss = -extra / work if work > 0 else 0.0
    why = {
        i: f"keeps {gang_only.counts[i]} above its fair share {fair[i]}: lifting the others to "
        f"{config.rebalance_floor:.0%} of their share would not pay its restarts ({loss:.1%} "
        f"less of the tier's work over the next {horizon:.0f} s)"
        for i in gang_only.reasons
    }
    return Rebalance(gang_only.counts, gang_only.bounds, gang_only.excluded, why)


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

    def highest(self) -> Rebalance | None:
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

    def solve(self, level: float) -> Rebalance | None:
        """Every above-share job kept at `level` x its share (at most what it keeps); None
        when that leaves a job out or below what it requires."""
        jobs, bounds, fair = self.solver.jobs, self.bounds, self.fair
        pinned = list(bounds)
        for j in self.required:  # a job at or below its share keeps what it keeps
            pinned[j] = (max(bounds[j][0], min(jobs[j].kept_total, fair[j])), bounds[j][1])
        for i in self.above:
            keep = min(
                jobs[i].kept_total, bounds[i][1], max(fair[i], math.ceil(level * fair[i] - 1e-9))
            )
            pinned[i] = (keep, keep)
        base, out = self.solver.admit(self.order, pinned)
        if not out <= self.excluded:
            return None
        counts = self.solver.fill([i for i in self.order if i not in out], base, pinned)
        if any(counts[j] < need for j, need in self.required.items()):
            return None
        why = {
            i: reasons.above_fair_share(counts[i], fair[i], self.config)
            for i in self.above
            if counts[i] > fair[i]
        }
        return Rebalance(counts, tuple(pinned), set(out), why)


@dataclass(frozen=True, slots=True)
class Holds:
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
) -> Holds:
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
            held[i] = reasons.shrink_deferred(ideal[i], now - grew, config)
        elif removal <= max(1, config.shrink_tolerance * item.kept_total) and (
            ideal[i] >= bounds[i][0]
        ):
            held[i] = reasons.shrink_skipped(removal)
            tolerance.add(i)
        else:
            allowed = min(removal, budget)
            budget -= allowed
            if allowed < removal:
                held[i] = reasons.removals_capped(ideal[i], config)
                pinned[i] = (item.kept_total - allowed, item.kept_total - allowed)
    for i in held:
        low, high = pinned[i]
        if low != high:
            keep = min(jobs[i].kept_total, high)
            pinned[i] = (keep, keep)
    return Holds(held, tuple(pinned), frozenset(tolerance))


def release_tolerance(holds: Holds, bounds: Bounds) -> Holds:
    """The holds without the tolerance skips: those jobs get their own bounds back."""
    released = tuple(
        bounds[i] if i in holds.tolerance else pinned for i, pinned in enumerate(holds.bounds)
    )
    kept = {i: why for i, why in holds.reasons.items() if i not in holds.tolerance}
    return Holds(kept, released, frozenset())


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
            and growth * held_share(item, total) < config.grow_tolerance
        ):
            final[i], deferred[i] = item.current, reasons.growth_deferred(growth)
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
        return item.current + part, reasons.growth_into_reclaimed_room(growth, part, lifetime, cost)

    def _pays(
        self, item: TierJob, growth: int, part: int, total: FloatArray, horizon: float
    ) -> bool:
        """Whether growing by `part` of `growth` pays over the lifetime of the room it leaves."""
        lifetime = self.lifetime(growth - part, item)
        if lifetime is None:
            grown = [item.current + part]
            return change_gain([item], [item.current], grown, horizon_s=horizon, total=total) > 0
        before = job_rate(item, item.current, total)
        after = job_rate(item, item.current + part, total)
        return growth_gain(before, after, lifetime_s=lifetime, cost_s=item.job.restart_cost_s) > 0
