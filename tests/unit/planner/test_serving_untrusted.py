"""A forecast the predictor no longer trusts (its recent coverage is too low) does not size
serving: observed demand does, and the plan says why."""

from __future__ import annotations

from dataclasses import replace

from tideshift.services.planner import core as pol
from tideshift.services.planner.core.serving import plan_serving

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
NOW = 1000.0


def forecast(rps: float) -> pol.Forecast:
    times = tuple(NOW + 60.0 * i for i in range(30))
    levels = {level: (rps * level,) * 30 for level in (0.5, 0.9, 0.95, 0.99)}
    return pol.Forecast(NOW, times, levels)


def size(forecast: pol.Forecast, *, current: int, observed: float) -> tuple[int, str, str | None]:
    planned = plan_serving(
        WEB,
        forecast,
        current=current,
        history=(),
        seen_since=-1e6,
        now=NOW,
        config=pol.PolicyConfig(),
        cluster_stale=False,
        observed=observed,
    )
    return planned.desired, planned.reason, planned.fallback


def test_an_untrusted_forecast_is_set_aside_for_observed_demand_with_the_reason() -> None:
    why = "q0.95 held for 52% of the last 120 steps"
    trusted = size(forecast(300.0), current=5, observed=120.0)
    untrusted = size(replace(forecast(300.0), untrusted=why), current=5, observed=120.0)
    # Trusted, the forecast's 300 req/s sizes serving beyond what is observed now.
    assert trusted[0] > 12 and trusted[2] is None
    # Untrusted, the 120 req/s observed does (12 replicas of 10 req/s), nothing less is kept.
    assert untrusted[0] == 12
    assert "forecast untrusted" in untrusted[1] and why in untrusted[1]
    assert untrusted[2] is not None and why in untrusted[2]


def test_an_untrusted_forecast_never_scales_serving_below_what_it_has() -> None:
    low = replace(forecast(10.0), untrusted="q0.95 held for 40% of the last 60 steps")
    desired, reason, _ = size(low, current=8, observed=20.0)
    assert desired == 8 and reason.startswith("holding 8")
