"""A flash crowd comes in waves: while demand runs above what the forecast allowed (the panic
window), the next lead time is priced at least at the rise just seen, not at the usual
quantile of a quiet day's rises (the 48 h family-flash-crowds run starved a minute at
1,580 -> 2,247 req/s, a wave after the first jump, priced at 1.26x)."""

from __future__ import annotations

import math

from tideshift.services.planner import core as pol
from tideshift.services.planner.core.model import Miss, Rises
from tideshift.services.planner.core.serving import plan_serving
from tideshift.services.planner.core.serving.headroom import recent_rise
from tideshift.services.planner.core.serving.price import price_for

SHOP = pol.ServingWorkload(
    target=pol.Target("default", "Deployment", "shop"),
    replica_requests=(1.0, 1.0, 0.0),
    capacity_rps=10.0,
    min_replicas=1,
    max_replicas=1000,
    lead_time_s=45.0,
    margin_s=30.0,
    stabilization_s=60.0,
    quantile=0.95,
    # Sized at q0.99: there the 1.8x jump is beyond the rises' quantile (at the default price,
    # 0.9983 of these 301 scores is their largest, the jump itself).
    shortfall_price=price_for(0.99, 1.0),
)
NOW = 10_000.0
# A quiet day of rises (at most 1.1x), then a jump of 1.8x measured from 30 s ago.
QUIET = tuple((NOW - 5000.0 + 15.0 * i, 1.0 + (i % 11) / 100) for i in range(300))
JUMP = Rises(scores=(*QUIET, (NOW - 30.0, 1.8)))


def desired(observed: float, rises: Rises) -> tuple[int, str]:
    """Replicas a plan orders with a forecast allowing 560 req/s now and over its window."""
    times = tuple(NOW + 60.0 * i for i in range(30))
    forecast = pol.Forecast(NOW, times, {0.5: (500.0,) * 30, 0.95: (560.0,) * 30})
    size = plan_serving(
        SHOP,
        forecast,
        current=60,
        history=(),
        seen_since=-1e6,
        now=NOW,
        config=pol.PolicyConfig(),
        cluster_stale=False,
        observed=observed,
        miss=Miss(panic_until=-math.inf, rises=rises),
    )
    return size.desired, size.reason


def test_in_a_panic_the_next_wave_is_priced_at_the_rise_just_seen() -> None:
    # 1,000 req/s is above the 560 the forecast allowed: 1,000 x 1.8 = 1,800 -> 180.
    replicas, reason = desired(1000.0, JUMP)
    assert replicas == 180, reason
    assert "x 1.80" in reason and "the rise just seen" in reason


def test_without_a_panic_the_usual_rise_applies() -> None:
    # 500 req/s is within what the forecast allowed: the usual q0.99 (1.10x) prices it.
    replicas, reason = desired(500.0, JUMP)
    assert replicas == 56, reason  # 500 x 1.10 needs 55: the forecast's 560 needs 56
    assert "the rise just seen" not in reason
    # In a panic with no large rise just seen, the usual quantile still applies.
    replicas, reason = desired(1000.0, Rises(scores=QUIET))
    assert replicas == 110, reason  # 1,000 x 1.10


def test_the_rise_just_seen_is_from_the_last_two_lead_times() -> None:
    assert recent_rise(JUMP, now=NOW, lead_time_s=45.0) == 1.8
    assert recent_rise(JUMP, now=NOW + 61.0, lead_time_s=45.0) == 1.0  # 91 s old: gone
    assert recent_rise(Rises(), now=NOW, lead_time_s=45.0) == 1.0
