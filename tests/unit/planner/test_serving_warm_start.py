"""Serving's rise history outlives a restart: bounded and validated as kept, a planner started
from it (or from the demand observed before it started) prices the next recurring spike
before it comes; one started from nothing meets it by reaction alone."""

from __future__ import annotations

import math

import pytest

from tideshift.services.planner import core as pol
from tideshift.services.planner.core.model import Miss, Rises
from tideshift.services.planner.core.serving import plan_serving, warm
from tideshift.services.planner.core.serving.headroom import recurrence

WEB = pol.ServingWorkload(
    target=pol.Target("default", "Deployment", "web"),
    replica_requests=(1.0, 1.0, 0.0),
    capacity_rps=10.0,
    min_replicas=1,
    max_replicas=500,
    lead_time_s=30.0,
    margin_s=30.0,
    stabilization_s=60.0,
    quantile=0.95,
)
CONFIG = pol.PolicyConfig()
SPIKES = [1800.0 + k * 7200.0 for k in range(5)]  # 5x for five minutes every two hours
NEXT_SPIKE = SPIKES[-1] + 7200.0


def demand(at: float) -> float:
    return 300.0 if any(start <= at < start + 300.0 for start in SPIKES) else 60.0


def desired_before_next_spike(rises: Rises) -> tuple[int, str]:
    """Replicas a plan a lead time before the next spike orders (forecast: 70 req/s)."""
    now = NEXT_SPIKE - 30.0
    times = tuple(now + 60.0 * i for i in range(30))
    forecast = pol.Forecast(now, times, {0.5: (63.0,) * 30, 0.95: (70.0,) * 30})
    size = plan_serving(
        WEB,
        forecast,
        current=7,
        history=(),
        seen_since=-1e6,
        now=now,
        config=CONFIG,
        cluster_stale=False,
        observed=60.0,
        miss=Miss(panic_until=-math.inf, rises=rises),
    )
    return size.desired, size.reason


def test_a_schedule_is_derived_from_the_demand_before_the_start() -> None:
    observed = warm.sampled(demand, start=0.0, end=SPIKES[-1] + 3600.0, every_s=15.0)
    rises = warm.derive(WEB, observed, CONFIG)
    found = recurrence(rises, WEB.quantile)
    assert found is not None
    assert found.period_s == pytest.approx(7200.0, rel=0.01)
    desired, reason = desired_before_next_spike(rises)
    assert desired == 30, reason  # 60 x 5 = 300 req/s, ready when the spike comes
    assert "recurring every 120 min is due" in reason
    # Started from nothing, the same plan orders what the forecast needs: the spike would
    # be met by reaction alone.
    desired, reason = desired_before_next_spike(Rises())
    assert desired == 7, reason


def test_what_is_kept_across_a_restart_still_prices_the_next_spike() -> None:
    observed = warm.sampled(demand, start=0.0, end=SPIKES[-1] + 3600.0, every_s=15.0)
    rises = warm.derive(WEB, observed, CONFIG)
    kept = warm.bounded(rises, now=SPIKES[-1] + 3600.0, window_s=CONFIG.rise_window_s)
    assert kept.pending == ()  # a restart leaves a gap they would be scored across
    assert len(kept.scores) <= warm.MAX_SCORES
    assert kept.onsets == rises.onsets
    assert desired_before_next_spike(kept)[0] == 30


def test_bounded_keeps_only_the_recent_finite_past_within_the_window() -> None:
    scores = tuple((float(at), 1.5) for at in range(warm.MAX_SCORES + 50))
    kept = warm.bounded(Rises(scores=scores), now=1e6, window_s=2e6)
    assert len(kept.scores) == warm.MAX_SCORES
    assert kept.scores[0][0] == 50.0  # the most recent ones
    odd = Rises(
        scores=((100.0, 2.0), (5.0, 1.2), (-1e9, 3.0), (200.0, math.nan), (2e6, 1.1)),
        onsets=((math.inf, 4.0), (150.0, -1.0), (120.0, 4.0)),
    )
    kept = warm.bounded(odd, now=1000.0, window_s=3600.0)
    # Sorted; older than the window, from the future, not finite or negative: left out.
    assert kept.scores == ((5.0, 1.2), (100.0, 2.0))
    assert kept.onsets == ((120.0, 4.0),)


def test_a_warm_start_never_replaces_what_the_planner_observed_itself() -> None:
    own = Miss(panic_until=50.0, rises=Rises(scores=((10.0, 1.2),)))
    other = pol.Target("default", "Deployment", "api")
    state = pol.PlanState(serving_misses={WEB.target: own})
    saved = Rises(onsets=((5.0, 4.0),))
    warmed = warm.warm_state(state, {WEB.target: saved, other: saved})
    assert warmed.serving_misses[WEB.target] is own
    assert warmed.serving_misses[other].rises == saved
    assert warmed.serving_misses[other].panic_until == -math.inf  # no panic carried over
    assert warm.held_rises(warmed, now=60.0, window_s=3600.0)[other].onsets == saved.onsets


def test_sampling_needs_a_positive_cadence() -> None:
    with pytest.raises(ValueError, match="every_s: expected > 0"):
        warm.sampled(demand, start=0.0, end=60.0, every_s=0.0)
    assert warm.sampled(demand, start=-60.0, end=0.0, every_s=20.0) == [
        (-60.0, 60.0),
        (-40.0, 60.0),
        (-20.0, 60.0),
    ]
