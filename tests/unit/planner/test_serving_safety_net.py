"""Serving's safety net: demand above the forecast scales up at once; a miss makes scale-down
wait through the panic window, not longer; room is held for the workload's own rises within a
lead time; a quiet workload is untouched."""

from __future__ import annotations

from dataclasses import replace

import pytest

from tideshift.events.models import Headroom
from tideshift.services.planner import core as pol
from tideshift.services.planner.core.model import Miss, Rises
from tideshift.services.planner.core.serving import PANIC, plan_serving, track_miss
from tideshift.services.planner.core.serving.price import price_for, service_level

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


def flat(rps: float, now: float) -> pol.Forecast:
    times = tuple(now + 60.0 * i for i in range(30))
    return pol.Forecast(now, times, {0.5: (rps * 0.9,) * 30, 0.95: (rps,) * 30})


def plan(
    now: float, *, forecast_rps: float, observed: float | None, current: int, miss=None
) -> tuple[int, str, pol.Miss]:
    size = plan_serving(
        WEB,
        flat(forecast_rps, now),
        current=current,
        history=(),
        seen_since=-1e6,
        now=now,
        config=CONFIG,
        cluster_stale=False,
        observed=observed,
        miss=miss,
    )
    return size.desired, size.reason, size.miss


def test_demand_below_the_forecast_changes_nothing() -> None:
    desired, reason, miss = plan(0.0, forecast_rps=100.0, observed=80.0, current=10)
    assert desired == 10
    assert miss.panic_until < 0.0
    assert "panic" not in reason and "miss" not in reason


def test_demand_above_the_forecast_scales_up_at_once_for_the_observed_demand() -> None:
    desired, reason, miss = plan(0.0, forecast_rps=100.0, observed=250.0, current=10)
    # 250 req/s observed against 100 allowed: observed needs 25.
    assert desired >= 25
    assert miss.panic_until == pytest.approx(CONFIG.panic_window_s)
    assert reason.startswith(PANIC), reason
    assert "observed 250.0 req/s needs 25" in reason


def test_scale_down_waits_through_the_panic_window_then_resumes() -> None:
    _, _, miss = plan(0.0, forecast_rps=100.0, observed=150.0, current=10)
    # The forecast now says 50 req/s (5 replicas) but the workload just ran 1.5x above it.
    desired, reason, miss = plan(30.0, forecast_rps=50.0, observed=40.0, current=15, miss=miss)
    assert desired == 15
    assert "panic window" in reason and PANIC in reason
    # Once the window is over, no memory of the miss holds serving's room: it follows the
    # forecast down (a spike every two hours once held the maximum all day).
    after = CONFIG.panic_window_s + 1.0
    desired, reason, miss = plan(after, forecast_rps=50.0, observed=40.0, current=15, miss=miss)
    assert desired < 15, reason
    assert "panic" not in reason


def test_a_miss_starts_the_panic_window_and_later_ones_extend_it() -> None:
    first = track_miss(None, observed=200.0, allowed=100.0, now=0.0, config=CONFIG)
    assert first.panic_until == pytest.approx(CONFIG.panic_window_s)
    quiet = track_miss(first, observed=90.0, allowed=100.0, now=30.0, config=CONFIG)
    assert quiet.panic_until == first.panic_until
    again = track_miss(quiet, observed=130.0, allowed=100.0, now=50.0, config=CONFIG)
    assert again.panic_until == pytest.approx(50.0 + CONFIG.panic_window_s)


def test_without_a_forecast_serving_still_covers_observed_demand() -> None:
    size = plan_serving(
        WEB,
        None,
        current=3,
        history=(),
        seen_since=0.0,
        now=10.0,
        config=CONFIG,
        cluster_stale=False,
        observed=120.0,
    )
    assert size.desired == 12
    assert size.fallback is not None


def test_rises_seen_within_a_lead_time_size_the_next_one_before_it_comes() -> None:
    # Every two minutes demand doubles within one lead time (30 s), then falls back.
    miss, now = None, 0.0
    for _ in range(20):
        for rps in (60.0, 120.0, 60.0, 60.0, 60.0, 60.0, 60.0, 60.0):
            _, _, miss = plan(now, forecast_rps=100.0, observed=rps, current=12, miss=miss)
            now += 15.0
    # Demand sits at 60 below a 100 req/s forecast: serving keeps room for the rise it keeps
    # seeing (60 x 2 = 120 req/s, 12 replicas), not the bare forecast's 10.
    desired, reason, miss = plan(now, forecast_rps=100.0, observed=60.0, current=12, miss=miss)
    assert desired == 12, reason
    assert "rise x 2.00" in reason and reason.startswith(PANIC), reason
    # A workload that never rose sizes at the bare forecast (10 replicas).
    desired, reason, _ = plan(now, forecast_rps=100.0, observed=60.0, current=12)
    assert desired == 10 and PANIC not in reason, reason


def test_the_reason_says_panic_only_when_the_safety_net_set_the_count() -> None:
    _, quiet, _ = plan(0.0, forecast_rps=100.0, observed=90.0, current=5)
    assert PANIC not in quiet and "scale up now" in quiet
    desired, surge, miss = plan(0.0, forecast_rps=100.0, observed=104.0, current=5)
    # 4 % above the forecast is within the miss tolerance (no panic), but the observed
    # demand alone needs one replica more than the forecast: the safety net set the count.
    assert miss.panic_until < 0.0
    assert desired == 11 and surge.startswith(PANIC), surge


def test_scale_down_releases_only_what_the_forecast_does_not_need_soon() -> None:
    def rising(now: float, later_rps: float) -> pol.Forecast:
        # The median: 50 req/s for five minutes, then `later_rps` for the rest of the half
        # hour; q0.95 is 1.2x it.
        values = tuple(50.0 if i < 5 else later_rps for i in range(30))
        times = tuple(now + 60.0 * i for i in range(30))
        return pol.Forecast(now, times, {0.5: values, 0.95: tuple(v * 1.2 for v in values)})

    def down_from_15(later_rps: float) -> tuple[int, str]:
        size = plan_serving(
            WEB,
            rising(0.0, later_rps),
            current=15,
            history=(),
            seen_since=-1e6,
            now=0.0,
            config=CONFIG,
            cluster_stale=False,
            observed=40.0,
        )
        return size.desired, size.reason

    # Demand returns to 150 req/s within the release horizon: the room stays with serving
    # (released, trainers would move in and straight out again).
    held, reason = down_from_15(150.0)
    assert held == 15 and "scale-down held" in reason, reason
    # It returns to 120 only: serving releases down to that, not to the next minutes' 5.
    partial, reason = down_from_15(120.0)
    assert partial == 12, reason
    # It stays low: serving scales down to what the next minutes need (q0.95: 60 req/s).
    low, _ = down_from_15(50.0)
    assert low == 6
    # Whether to release is a bet on the median: its 140 req/s later keeps 14 of the 15;
    # q0.95's 168 req/s would have held all 15.
    median, reason = down_from_15(140.0)
    assert median == 14 and "median" in reason, reason


def test_a_rise_that_recurs_on_a_schedule_is_held_only_when_the_next_is_due() -> None:
    # 60 req/s, and 5x it for five minutes every two hours: a schedule after four spikes.
    miss, now = None, 0.0
    spikes = [1800.0 + k * 7200.0 for k in range(4)]
    while now < spikes[-1] + 3600.0:
        rps = 300.0 if any(s <= now < s + 300.0 for s in spikes) else 60.0
        _, _, miss = plan(now, forecast_rps=70.0, observed=rps, current=30, miss=miss)
        now += 15.0
    next_spike = spikes[-1] + 7200.0
    # An hour before the next spike: sized for the forecast (7), not the spike.
    desired, reason, _ = plan(
        next_spike - 3600.0, forecast_rps=70.0, observed=60.0, current=7, miss=miss
    )
    assert desired == 7, reason
    # A lead time before it: sized for 60 x 5 = 300 req/s, ready when the spike comes.
    desired, reason, _ = plan(
        next_spike - 30.0, forecast_rps=70.0, observed=60.0, current=7, miss=miss
    )
    assert desired == 30, reason
    assert "a rise recurring every 120 min is due" in reason and reason.startswith(PANIC)
    # The published plan carries the period, for `tideshift explain`.
    size = plan_serving(
        WEB,
        flat(70.0, next_spike - 30.0),
        current=7,
        history=(),
        seen_since=-1e6,
        now=next_spike - 30.0,
        config=CONFIG,
        cluster_stale=False,
        observed=60.0,
        miss=miss,
    )
    published = Headroom.model_validate(size.headroom)
    assert published.recurring_period_s == pytest.approx(7200.0, rel=0.01)


def test_the_rise_is_priced_at_the_level_the_shortfall_price_sets() -> None:
    # 97 rises of nothing and 3 of 3x: the q0.95 of the rises sees no rise, q0.99 sees 3x.
    rises = Rises(scores=tuple((float(i), 3.0 if i >= 97 else 1.0) for i in range(100)))
    miss = Miss(panic_until=-1e9, observed=100.0, rises=rises)

    def desired(level: float) -> int:
        size = plan_serving(
            replace(WEB, shortfall_price=price_for(level, WEB.replica_requests[0])),
            flat(50.0, 0.0),
            current=5,
            history=(),
            seen_since=-1e6,
            now=0.0,
            config=CONFIG,
            cluster_stale=False,
            observed=100.0,
            miss=miss,
        )
        return size.desired

    # 100 req/s x 3 = 300 req/s, 30 replicas of 10 req/s, ready before such a burst.
    assert desired(0.99) == 30
    # A cheap shortfall (level 0.5) covers only the observed demand (100 req/s).
    assert desired(0.5) == 10
    # The default price (10 core-hours per replica-minute) sizes a 1-core replica at 0.9983.
    assert service_level(WEB) == pytest.approx(1 - 1 / 600)


# A forecast the predictor no longer trusts (its recent coverage is too low) does not size
# serving: observed demand does, and the plan says why.


def every_level(rps: float, now: float) -> pol.Forecast:
    times = tuple(now + 60.0 * i for i in range(30))
    return pol.Forecast(now, times, {q: (rps * q,) * 30 for q in (0.5, 0.9, 0.95, 0.99)})


def size(forecast: pol.Forecast, *, current: int, observed: float) -> tuple[int, str, str | None]:
    planned = plan_serving(
        WEB,
        forecast,
        current=current,
        history=(),
        seen_since=-1e6,
        now=forecast.issued_at,
        config=CONFIG,
        cluster_stale=False,
        observed=observed,
    )
    return planned.desired, planned.reason, planned.fallback


def test_an_untrusted_forecast_is_set_aside_for_observed_demand_with_the_reason() -> None:
    why = "q0.95 held for 52% of the last 120 steps"
    trusted = size(every_level(300.0, 1000.0), current=5, observed=120.0)
    untrusted = size(replace(every_level(300.0, 1000.0), untrusted=why), current=5, observed=120.0)
    # Trusted, the forecast's 300 req/s sizes serving beyond what is observed now.
    assert trusted[0] > 12 and trusted[2] is None
    # Untrusted, the 120 req/s observed does (12 replicas of 10 req/s), nothing less is kept.
    assert untrusted[0] == 12
    assert "forecast untrusted" in untrusted[1] and why in untrusted[1]
    assert untrusted[2] is not None and why in untrusted[2]


def test_an_untrusted_forecast_never_scales_serving_below_what_it_has() -> None:
    low = replace(every_level(10.0, 1000.0), untrusted="q0.95 held for 40% of the last 60 steps")
    desired, reason, _ = size(low, current=8, observed=20.0)
    assert desired == 8 and reason.startswith("holding 8")
