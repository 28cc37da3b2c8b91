"""What serving's headroom learned, kept across a restart: a workload's rises within one lead
time and its onsets (serving/headroom.py), as a bounded value a planner saves and a fresh one
starts from, or derives from the demand observed before it started.

A planner that forgot them met the first four spikes of a schedule after every start by
reaction alone (family-periodic-spikes: 3 shortfall minutes, all in its first 7 hours). Pure;
time is an argument."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import replace

import numpy as np

from tideshift.services.planner.core.model import (
    Miss,
    PlanState,
    PolicyConfig,
    Rises,
    ServingWorkload,
    Target,
)
from tideshift.services.planner.core.serving import headroom

# A day of scores at one plan every 15 s is 5,760; the most recent ones are kept (a q0.99 of
# them needs only a few hundred), and onsets are a few per hour at most.
MAX_SCORES = 4096
MAX_ONSETS = 256


def _recent(
    items: Iterable[tuple[float, float]], *, now: float, window_s: float, limit: int
) -> tuple[tuple[float, float], ...]:
    """The items within `window_s` before `now` (none from the future), finite and not
    negative, oldest first, at most the `limit` most recent."""
    kept = sorted(
        (start, score)
        for start, score in items
        if math.isfinite(start)
        and math.isfinite(score)
        and score >= 0
        and now - window_s < start <= now
    )
    return tuple(kept[-limit:]) if limit > 0 else ()


def bounded(rises: Rises, *, now: float, window_s: float) -> Rises:
    """What of `rises` is kept across a restart: the scores and onsets of the last `window_s`
    (at most `MAX_SCORES` and `MAX_ONSETS`, the most recent); observations not yet a lead time
    old are not (a restart leaves a gap they would be scored across)."""
    return Rises(
        scores=_recent(rises.scores, now=now, window_s=window_s, limit=MAX_SCORES),
        onsets=_recent(rises.onsets, now=now, window_s=window_s, limit=MAX_ONSETS),
    )


def derive(
    workload: ServingWorkload,
    observations: Iterable[tuple[float, float]],
    config: PolicyConfig,
) -> Rises:
    """The rises a planner would hold had it observed `observations` ((time, req/s), oldest
    first, at its plan cadence) since before the first: a fresh install learns a schedule
    from the demand of the last day instead of from its next four spikes."""
    window = headroom.window(workload, Rises(), config)
    for at, value in observations:
        window.observe(value, at)
    return window.rises()


def sampled(
    rate: Callable[[float], float], *, start: float, end: float, every_s: float
) -> list[tuple[float, float]]:
    """`rate` at every `every_s` from `start` to before `end`: demand as a planner planning on
    that cadence observed it."""
    if every_s <= 0:
        raise ValueError(f"every_s: expected > 0, got {every_s!r}")
    times = np.arange(start, end, every_s, dtype=np.float64)
    return [(float(at), float(rate(float(at)))) for at in times]


def warm_state(state: PlanState, rises: Mapping[Target, Rises]) -> PlanState:
    """`state` with each workload's rises started from `rises`; a workload the state already
    observed keeps its own (they are newer)."""
    misses = dict(state.serving_misses)
    for target, kept in rises.items():
        if target not in misses:
            misses[target] = Miss(panic_until=-math.inf, rises=kept)
    return replace(state, serving_misses=misses)


def held_rises(state: PlanState, *, now: float, window_s: float) -> dict[Target, Rises]:
    """Each serving workload's rises as a restarted planner should find them (`bounded`)."""
    return {
        target: bounded(miss.rises, now=now, window_s=window_s)
        for target, miss in state.serving_misses.items()
    }
