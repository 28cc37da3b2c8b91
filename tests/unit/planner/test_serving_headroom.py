"""Serving's priced headroom: rises within one lead time become calibration scores over a
bounded window, and the workload's quantile of them is the rise it holds room for."""

from __future__ import annotations

import pytest

from tideshift.services.planner.core.model import Rises, ServingWorkload, Target
from tideshift.services.planner.core.serving.headroom import (
    observe_rise,
    priced_rise,
    recurrence,
    rise_quantile,
)


def feed(points: list[tuple[float, float | None]], *, window_s: float = 3600.0) -> Rises:
    rises = Rises()
    for now, observed in points:
        rises = observe_rise(
            rises, observed=observed, now=now, lead_time_s=60.0, window_s=window_s, floor_rps=1.0
        )
    return rises


def test_a_rise_is_the_highest_demand_within_one_lead_time_over_the_start() -> None:
    # 100 at 0, then 150 and 300 within 60 s, 900 after it: the rise from 0 is 3x.
    rises = feed([(0.0, 100.0), (30.0, 150.0), (60.0, 300.0), (90.0, 900.0)])
    assert rises.scores[0] == (0.0, pytest.approx(3.0))
    # 150 at 30 is a lead time old at 90: 900 / 150.
    assert rises.scores[1] == (30.0, pytest.approx(6.0))
    assert [t for t, _ in rises.pending] == [60.0, 90.0]  # not a lead time old yet


def test_an_observation_nothing_followed_within_the_lead_time_measures_nothing() -> None:
    rises = feed([(0.0, 100.0), (120.0, 500.0), (180.0, 500.0)])
    assert [t for t, _ in rises.scores] == [120.0]  # 0 had no later point within 60 s


def test_a_rise_from_near_zero_is_counted_from_the_floor() -> None:
    rises = feed([(0.0, 0.0), (30.0, 0.5), (60.0, 0.5)])
    assert rises.scores[0][1] == pytest.approx(0.5)  # 0.5 / max(0, 1 req/s)


def test_scores_older_than_the_window_are_dropped() -> None:
    rises = feed([(0.0, 100.0), (30.0, 200.0), (60.0, 100.0), (4000.0, 100.0)], window_s=3600.0)
    # The rises from 0 and 30 finish only at 4000, over an hour after they started.
    assert not rises.scores
    assert feed([(0.0, 100.0), (30.0, 200.0), (60.0, 100.0)], window_s=3600.0).scores


def test_the_quantile_is_split_conformal_and_never_below_one() -> None:
    scores = tuple((float(i), 1.0 + i / 100) for i in range(100))  # 1.00 .. 1.99
    rises = Rises(scores=scores)
    # ceil(101 x 0.95) = 96th smallest: 1.95; with too few scores, the largest.
    assert rise_quantile(rises, 0.95) == pytest.approx(1.95)
    assert rise_quantile(Rises(scores=((0.0, 1.5), (1.0, 1.2))), 0.95) == pytest.approx(1.5)
    assert rise_quantile(Rises(scores=((0.0, 0.5),)), 0.95) == 1.0  # falls are no headroom
    assert rise_quantile(Rises(), 0.95) == 1.0


def spikes(
    *,
    period_s: float,
    count: int,
    base: float = 100.0,
    height: float = 5.0,
    jitter_s: list[float] | None = None,
) -> list[tuple[float, float]]:
    """Observations every 20 s: `base`, and `height` x it for five minutes every `period_s`
    (the k-th spike moved by jitter_s[k] seconds)."""
    starts = [
        1800.0 + k * period_s + (jitter_s[k] if jitter_s is not None else 0.0) for k in range(count)
    ]
    points = []
    for step in range(int((starts[-1] + 1200.0) / 20.0)):
        now = step * 20.0
        inside = any(start <= now < start + 300.0 for start in starts)
        points.append((now, base * height if inside else base))
    return points


def feed_lead(points: list[tuple[float, float]], *, lead_time_s: float = 45.0) -> Rises:
    rises = Rises()
    for now, observed in points:
        rises = observe_rise(
            rises,
            observed=observed,
            now=now,
            lead_time_s=lead_time_s,
            window_s=86400.0,
            floor_rps=1.0,
        )
    return rises


def test_a_large_rise_is_one_onset_however_many_observations_saw_it_coming() -> None:
    rises = feed_lead(spikes(period_s=7200.0, count=3))
    # Three spikes, each seen from the observations within a lead time before it: 3 onsets.
    assert len(rises.onsets) == 3
    assert all(ratio == pytest.approx(5.0) for _, ratio in rises.onsets)
    # Among ~600 scores per spike, the few at its start are far below 5 %: the plain
    # quantile ignores them, which is why onsets are kept apart.
    assert rise_quantile(rises, 0.95) == pytest.approx(1.0)


def test_onsets_on_a_schedule_are_found_despite_jitter() -> None:
    jitter = [0.0, 400.0, -300.0, 500.0, -200.0, 100.0]
    rises = feed_lead(spikes(period_s=7200.0, count=6, jitter_s=jitter))
    found = recurrence(rises, 0.95)
    assert found is not None
    assert found.period_s == pytest.approx(7200.0, rel=0.05)
    assert found.ratio == pytest.approx(5.0)
    # The schedule's spread covers the jitter (the farthest spike from the fitted line).
    assert 200.0 <= found.spread_s <= 0.3 * found.period_s


def test_onsets_off_any_schedule_are_no_recurrence() -> None:
    points = []
    for start in (1800.0, 3000.0, 9000.0, 10000.0, 20000.0):  # gaps 1200, 6000, 1000, 10000
        points += [(start - 40.0, 100.0), (start - 20.0, 100.0), (start, 500.0)]
    points.append((20100.0, 100.0))
    rises = feed_lead(sorted(points))
    assert len(rises.onsets) == 5
    assert recurrence(rises, 0.95) is None
    assert recurrence(feed_lead(spikes(period_s=7200.0, count=3)), 0.95) is None  # too few


def test_a_recurring_rise_is_due_around_its_time_and_not_after_it_came() -> None:
    points = spikes(period_s=7200.0, count=5)
    rises = feed_lead(points)
    found = recurrence(rises, 0.95)
    assert found is not None
    last_spike = 1800.0 + 4 * 7200.0
    next_spike = last_spike + 7200.0
    # Between spikes: not due (nothing held for it).
    assert not found.due(rises, now=last_spike + 3600.0, lead_time_s=45.0)
    # Within a lead time before the next spike: due, so its replicas are ready when it comes.
    assert found.due(rises, now=next_spike - 45.0, lead_time_s=45.0)
    # Once it came (its onset recorded), it is no longer due: the room is released.
    came = feed_lead(spikes(period_s=7200.0, count=6))
    assert not found.due(came, now=next_spike + 120.0, lead_time_s=45.0)


def test_frequent_onsets_do_not_make_themselves_usual() -> None:
    # A spike every 20 min: the scores at each spike's start are about 4 % of all, more than
    # the 1 % beyond the usual rise an onset must be; they are still onsets, on schedule.
    rises = feed_lead(spikes(period_s=1200.0, count=8))
    assert len(rises.onsets) == 8
    found = recurrence(rises, 0.95)
    assert found is not None and found.period_s == pytest.approx(1200.0, rel=0.02)


def test_the_next_onset_is_due_within_the_schedule_lines_own_error() -> None:
    # A day of onsets of family-periodic-spikes (seed 11, jittered by up to a tenth of the
    # period): the line through them puts the next at 61,678 s; it came at 60,840 (838 s
    # early), beyond the widened farthest onset (635 s) and a tenth of the period (731 s).
    starts = [-18940, -11860, -4360, 3560, 10460, 18140, 25520, 32780, 39800, 46520, 54080]
    rises = Rises(onsets=tuple((float(start), 4.0) for start in starts))
    found = recurrence(rises, 0.95)
    assert found is not None
    assert found.phase_s + 11 * found.period_s == pytest.approx(61678.0, abs=1.0)
    # Ordered a lead time before the jump (the onset is the observation before it).
    assert found.due(rises, now=60840.0 - 45.0, lead_time_s=45.0)
    # Not held for half a period before it.
    assert not found.due(rises, now=61678.0 - 3600.0, lead_time_s=45.0)


def test_onsets_on_a_schedule_are_priced_only_when_due_not_in_the_plain_rise() -> None:
    # A spike every 20 min: its jumps are 5 % of the scores, so the plain q0.99 would be the
    # spike's 5x at all times; on a schedule they are held only when the next is due.
    workload = ServingWorkload(
        target=Target("default", "Deployment", "web"),
        replica_requests=(1.0, 1.0, 0.0),
        capacity_rps=1.0,
        min_replicas=1,
        max_replicas=1000,
        lead_time_s=45.0,
        margin_s=30.0,
        stabilization_s=60.0,
        quantile=0.95,
    )
    points = spikes(period_s=1200.0, count=8)
    rises = feed_lead(points)
    assert rise_quantile(rises, 0.99) == pytest.approx(5.0)  # all scores: the jumps
    next_spike = 1800.0 + 8 * 1200.0
    _, between, _, _ = priced_rise(workload, rises, 100.0, next_spike - 600.0, 0.99)
    assert between < 1.5
    _, due, period_s, _ = priced_rise(workload, rises, 100.0, next_spike - 45.0, 0.99)
    assert due == pytest.approx(5.0) and period_s == pytest.approx(1200.0, rel=0.02)


def test_the_rise_says_which_level_priced_it() -> None:
    """The priced level, however few the scores (with fewer than it can rank, their largest):
    the plan's reason quotes the level that applied."""
    workload = ServingWorkload(
        Target("shop", "Deployment", "web"), (1.0, 0.0, 0.0), capacity_rps=10.0, lead_time_s=60.0
    )
    few = Rises(scores=tuple((float(i), 1.0 + i / 100) for i in range(50)))
    many = Rises(scores=tuple((float(i), 1.0 + i / 1000) for i in range(200)))
    assert priced_rise(workload, few, 100.0, 300.0, 0.99)[1:4:2] == (pytest.approx(1.49), 0.99)
    assert priced_rise(workload, many, 100.0, 300.0, 0.9)[1:4:2] == (pytest.approx(1.180), 0.9)
