"""Serving's one priced decision (serving/price.py): the shortfall price sets the demand level
serving is sized at, and that level sizes both the forecast's peak and the priced rise."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from tideshift.events.models import ServingPolicy
from tideshift.services.planner import core as pol
from tideshift.services.planner.core.model import Miss, Rises
from tideshift.services.planner.core.serving import plan_serving
from tideshift.services.planner.core.serving.price import (
    MAX_LEVEL,
    MIN_LEVEL,
    price_for,
    service_level,
)

WEB = pol.ServingWorkload(
    target=pol.Target("default", "Deployment", "web"),
    replica_requests=(1.0, 1.0, 0.0),
    capacity_rps=10.0,
    min_replicas=1,
    max_replicas=1000,
    lead_time_s=30.0,
    margin_s=30.0,
    stabilization_s=60.0,
)


def test_the_level_is_where_a_shortfalls_price_meets_the_training_displaced() -> None:
    # The module's worked example: 1 - cpu / (60 x price).
    assert service_level(WEB) == pytest.approx(1 - 1 / 600)  # default 10 core-hours
    four_cores = replace(WEB, replica_requests=(4.0, 1.0, 0.0))
    assert service_level(four_cores) == pytest.approx(1 - 4 / 600)
    assert service_level(replace(WEB, shortfall_price=0.05)) == pytest.approx(1 - 1 / 3)
    # A shortfall worth less than the median's replica is sized at the median, never below.
    assert service_level(replace(WEB, shortfall_price=0.001)) == MIN_LEVEL
    assert service_level(replace(WEB, shortfall_price=1e9)) == MAX_LEVEL
    assert price_for(service_level(four_cores), 4.0) == pytest.approx(10.0)
    with pytest.raises(ValueError, match="level"):
        price_for(1.0, 1.0)


def test_the_price_is_declared_once_on_the_serving_spec() -> None:
    spec = ServingPolicy.model_validate({"capacity_rps": 10.0, "shortfall_price": 2.5})
    workload = pol.ServingWorkload.of(WEB.target, WEB.replica_requests, spec)
    assert workload.shortfall_price == 2.5
    with pytest.raises(ValueError, match="shortfall_price"):
        ServingPolicy.model_validate({"capacity_rps": 10.0, "shortfall_price": 0})


def _size(price: float) -> tuple[int, str]:
    """Replicas at `price`: a forecast whose quantiles rise with the level, and 100 rises of
    which the largest are 1.5x, 2x and 3x."""
    times = tuple(60.0 * i for i in range(30))
    forecast = pol.Forecast(
        0.0, times, {0.5: (100.0,) * 30, 0.9: (120.0,) * 30, 0.99: (150.0,) * 30}
    )
    scores = (*((float(i), 1.0) for i in range(97)), (97.0, 1.5), (98.0, 2.0), (99.0, 3.0))
    size = plan_serving(
        replace(WEB, shortfall_price=price),
        forecast,
        current=10,
        history=(),
        seen_since=-1e6,
        now=0.0,
        config=pol.PolicyConfig(),
        cluster_stale=False,
        observed=100.0,
        miss=Miss(panic_until=-math.inf, rises=Rises(scores=scores)),
    )
    return size.desired, size.reason


def test_a_higher_price_sizes_serving_for_rarer_demand() -> None:
    cheap, reason = _size(price_for(0.6, 1.0))
    assert cheap == 12, reason  # the forecast's q0.9 (120 req/s); the rises' q0.6 is 1x
    assert "forecast q0.9 " in reason
    dear, reason = _size(price_for(0.99, 1.0))
    assert dear == 30, reason  # the rises' q0.99: 100 x 3 = 300 req/s
    assert "q0.99 of recent rises" in reason
    # In between, q0.975 of the rises is the 2x: 200 req/s beats the forecast's q0.99 (150).
    assert _size(price_for(0.975, 1.0))[0] == 20
