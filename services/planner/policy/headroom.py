"""Serving's headroom, priced rather than remembered: how far the workload's own demand rose
within one start-up time (its lead time), at the quantile it asks for, from a bounded window
of its recent observations (a split-conformal quantile: each finished lead time is one
calibration score). Replicas ordered now are ready one lead time later; until then the
replicas already there carry whatever demand does. Pure; time is an argument."""

from __future__ import annotations

import math

from tideshift.services.planner.policy.model import Rises


def observe_rise(
    rises: Rises,
    *,
    observed: float | None,
    now: float,
    lead_time_s: float,
    window_s: float,
    floor_rps: float,
) -> Rises:
    """`rises` after an observation at `now`: every observation a whole lead time old becomes
    a score, the highest demand seen within the lead time after it / it (at least
    `floor_rps`, so a rise from near zero within one replica's capacity is not a huge ratio);
    scores older than `window_s` are dropped."""
    pending = rises.pending if observed is None else (*rises.pending, (now, observed))
    scores = list(rises.scores)
    kept: list[tuple[float, float]] = []
    for index, (start, value) in enumerate(pending):
        if now - start < lead_time_s:
            kept.append((start, value))
            continue
        later = [v for t, v in pending[index + 1 :] if t - start <= lead_time_s]
        # An observation nothing followed within the lead time (a gap) measures no rise.
        if later:
            scores.append((start, max(later) / max(value, floor_rps)))
    return Rises(
        pending=tuple(kept), scores=tuple(item for item in scores if now - item[0] <= window_s)
    )


def rise_quantile(rises: Rises, quantile: float) -> float:
    """The split-conformal `quantile` of the scores: the ceil((n + 1) q)-th smallest (the
    largest when there are too few), never below 1; 1 with no score yet (the forecast and
    the reaction to observed demand still apply)."""
    ratios = sorted(score for _, score in rises.scores)
    if not ratios:
        return 1.0
    rank = min(math.ceil((len(ratios) + 1) * quantile), len(ratios))
    return max(1.0, ratios[rank - 1])
