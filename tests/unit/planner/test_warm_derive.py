"""`warm.derive` runs through a day of observations in one `RiseWindow` instead of rebuilding
the window at every one (quadratic: 16 s before an nginx simulation): it must hold exactly
the rises the old step-by-step rebuild held, gaps, onsets and forgotten ones included."""

from __future__ import annotations

import math

import numpy as np
import pytest

from tideshift.services.planner import core as pol
from tideshift.services.planner.core.model import Rises
from tideshift.services.planner.core.serving import headroom, warm
from tideshift.services.planner.core.serving.headroom import ONSET_MIN_RATIO, observe


def reference_observe(
    rises: Rises, observed: float | None, now: float, lead: float, window: float, floor: float
) -> Rises:
    """The rebuild `observe_rise` did before `RiseWindow` (d9f7b67), kept as the oracle."""

    def usual(scores: list[tuple[float, float]], onsets: list[tuple[float, float]]) -> float:
        plain = []
        for t, score in scores:
            before = [start for start, _ in onsets if start <= t]
            if not before or t - before[-1] > lead:
                plain.append(score)
        ordered = sorted(plain)
        if not ordered:
            return 1.0
        rank = min(math.ceil((len(ordered) + 1) * 0.99), len(ordered))
        return max(1.0, ordered[rank - 1])

    pending = rises.pending if observed is None else (*rises.pending, (now, observed))
    scores, onsets = list(rises.scores), list(rises.onsets)
    kept = []
    for index, (start, value) in enumerate(pending):
        if now - start < lead:
            kept.append((start, value))
            continue
        later = [v for t, v in pending[index + 1 :] if t - start <= lead]
        if not later:
            continue
        score = max(later) / max(value, floor)
        if (
            score >= ONSET_MIN_RATIO
            and (not onsets or start - onsets[-1][0] > lead)
            and score > usual(scores, onsets)
        ):
            onsets.append((start, score))
        scores.append((start, score))
    return Rises(
        pending=tuple(kept),
        scores=tuple(item for item in scores if now - item[0] <= window),
        onsets=tuple(item for item in onsets if now - item[0] <= window),
    )


def workload(lead_time_s: float) -> pol.ServingWorkload:
    return pol.ServingWorkload(
        target=pol.Target("default", "Deployment", "web"),
        replica_requests=(1.0, 1.0, 0.0),
        capacity_rps=10.0,
        min_replicas=1,
        max_replicas=500,
        lead_time_s=lead_time_s,
    )


def stream(seed: int, count: int, every_s: float) -> list[tuple[float, float | None]]:
    """Noisy demand with jumps of 2-6x (some on a schedule, some not), dips to zero and
    missing observations, on an irregular plan cadence."""
    rng = np.random.default_rng(seed)
    points: list[tuple[float, float | None]] = []
    now = 0.0
    for step in range(count):
        now += every_s * float(rng.uniform(0.5, 1.5))
        level = 50.0 * float(rng.lognormal(0.0, 0.4))
        if step % 40 < 3 or rng.random() < 0.01:
            level *= float(rng.uniform(2.0, 6.0))
        if rng.random() < 0.02:
            level = 0.0
        points.append((now, None if rng.random() < 0.05 else level))
    return points


@pytest.mark.parametrize(
    ("seed", "lead_time_s", "window_s"),
    [(1, 45.0, 3600.0), (2, 60.0, 900.0), (3, 20.0, 600.0), (4, 90.0, 7200.0)],
)
def test_derive_holds_what_the_step_by_step_rebuild_held(
    seed: int, lead_time_s: float, window_s: float
) -> None:
    points = stream(seed, 3000, 15.0)
    web = workload(lead_time_s)
    config = pol.PolicyConfig(rise_window_s=window_s)
    expected = Rises()
    for now, observed in points:
        expected = reference_observe(expected, observed, now, lead_time_s, window_s, 10.0)
    observations = [(now, value) for now, value in points if value is not None]
    # derive sees no gaps (a sampled rate); the rebuild fed only those observations agrees.
    without_gaps = Rises()
    for now, value in observations:
        without_gaps = reference_observe(without_gaps, value, now, lead_time_s, window_s, 10.0)
    derived = warm.derive(web, observations, config)
    assert derived == without_gaps
    # The windows were forgotten from and onsets found (the cases the fast path keeps apart).
    assert derived.onsets and derived.scores[0][0] > points[0][0] + lead_time_s
    # One plan at a time (a fresh window per observation) holds the same, gaps included.
    stepped = Rises()
    for now, observed in points:
        stepped = observe(web, stepped, observed, now, config)
    assert stepped == expected


def test_derive_continues_from_kept_rises_as_the_rebuild_would() -> None:
    points = [(now, value) for now, value in stream(5, 1200, 20.0) if value is not None]
    web, config = workload(45.0), pol.PolicyConfig(rise_window_s=1800.0)
    first = warm.derive(web, points[:600], config)
    expected = first
    for now, value in points[600:]:
        expected = reference_observe(expected, value, now, 45.0, 1800.0, 10.0)
    window = headroom.window(web, first, config)
    for now, value in points[600:]:
        window.observe(value, now)
    assert window.rises() == expected
