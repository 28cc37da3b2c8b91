"""Serving's priced headroom: rises within one lead time become calibration scores over a
bounded window, and the workload's quantile of them is the rise it holds room for."""

from __future__ import annotations

import pytest

from tideshift.services.planner.policy.headroom import observe_rise, rise_quantile
from tideshift.services.planner.policy.model import Rises


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
