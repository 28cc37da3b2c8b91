"""Churn limits: which voluntary trainer removals (rebalancing, not forced by serving or a
higher tier) wait, are skipped or are capped this step, and which small growths wait. Pure
functions returning new values; the solver's state is never edited."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from tideshift.services.planner.policy import reasons
from tideshift.services.planner.policy.model import PolicyConfig, Target
from tideshift.services.planner.policy.tiers import Bounds, TierJob


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
    config: PolicyConfig,
) -> tuple[list[int], dict[int, str]]:
    """Small growth of a running job waits until it is worth a membership change: each change
    costs the job a restart, and serving's jitter would otherwise make trainers come and go
    every few minutes. Returns the counts and the reasons of the deferred jobs."""
    final = list(counts)
    deferred: dict[int, str] = {}
    for i, item in enumerate(jobs):
        growth = final[i] - item.current
        if i in skip or growth <= 0 or item.current < item.job.floor:
            continue
        # Small in trainers and in the cluster: one large trainer (a node's worth) is no jitter.
        if (
            growth <= max(1, config.grow_tolerance * item.current)
            and growth * item.dominant < config.grow_tolerance
        ):
            final[i] = item.current
            deferred[i] = reasons.growth_deferred(growth)
    return final, deferred
