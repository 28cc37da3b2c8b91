"""The planner service's safety net wiring: observed demand kept per workload, stale ones
ignored, and one above what the last plan allowed for triggers a plan that covers it."""

from __future__ import annotations

import math
from datetime import UTC, datetime, timedelta

from tideshift.events import (
    DemandObserved,
    ForecastIssued,
    ForecastPoint,
    NodeChanged,
    Resources,
    WorkloadRef,
)
from tideshift.services.planner.core.baselines import make_policy
from tideshift.services.planner.core.state import PlannerState
from tideshift.services.planner.settings import PlannerSettings, ServingTarget

NOW = 1_800_000_000.0
WEB = WorkloadRef(kind="Deployment", namespace="shop", name="web")
CAPACITY_RPS = 100.0


def state_with_a_forecast(*, forecast_rps: float) -> PlannerState:
    settings = PlannerSettings(
        serving=[
            ServingTarget(
                namespace="shop",
                name="web",
                cpu=1.0,
                capacity_rps=CAPACITY_RPS,
                min_replicas=1,
                max_replicas=50,
                stabilization_s=0.0,  # so only the safety net holds scale-down
            )
        ],
        observed_max_age_seconds=30.0,
        health_port=-1,
    )
    state = PlannerState(settings.state_config(), started_at=NOW)
    at = datetime.fromtimestamp(NOW, tz=UTC)
    state.apply_node(
        NodeChanged(change="added", name="n1", allocatable=Resources(cpu=64.0), observed_at=at),
        NOW,
    )
    state.apply_forecast(
        ForecastIssued(
            workload=WEB,
            issued_at=at,
            step_seconds=60,
            model="test",
            points=tuple(
                ForecastPoint(
                    at=at + timedelta(seconds=60 * k),
                    point=forecast_rps,
                    q50=forecast_rps,
                    q90=forecast_rps,
                    q95=forecast_rps,
                    q99=forecast_rps,
                )
                for k in range(10)
            ),
        ),
        NOW,
    )
    return state


def observed(rps: float, at: float) -> DemandObserved:
    return DemandObserved(workload=WEB, rps=rps, observed_at=datetime.fromtimestamp(at, tz=UTC))


def plan(state: PlannerState, policy_state: object, now: float) -> tuple[int, str, object]:
    """One plan as the service makes it; the serving decision for WEB and the new state."""
    policy = make_policy("tideshift")
    targets = state.targets({}, now)
    decision, new_state = policy.plan(state.inputs(now, targets), policy_state, now)
    state.remember_allowed(targets.serving, decision.targets)
    (web,) = [item for item in decision.targets if item.target == WEB]
    state.known[WEB] = web.desired  # as the leader's command does
    return web.desired, web.reason, new_state


def test_a_high_fresh_observation_plans_at_once_and_the_plan_covers_it() -> None:
    state = state_with_a_forecast(forecast_rps=150.0)
    policy_state = make_policy("tideshift").initial_state()
    desired, reason, policy_state = plan(state, policy_state, NOW)
    assert desired == 2, reason
    assert state.allowed_rps[WEB] == 2 * CAPACITY_RPS

    # Within what the plan allowed for: no plan at once.
    assert not state.apply_observed(observed(180.0, NOW + 5), NOW + 5)

    # Above it: plan now, sized for the observation (the reactive floor).
    assert state.apply_observed(observed(870.0, NOW + 6), NOW + 5)
    desired, reason, policy_state = plan(state, policy_state, NOW + 7)
    assert desired >= math.ceil(870.0 / CAPACITY_RPS), reason
    assert "observed 870.0 req/s needs 9" in reason
    assert state.allowed_rps[WEB] >= 870.0

    # Demand back at the forecast: the recent miss keeps the replicas (no scale-down yet).
    assert not state.apply_observed(observed(150.0, NOW + 20), NOW + 20)
    held, reason, _ = plan(state, policy_state, NOW + 20)
    assert held == desired, reason
    assert "panic window" in reason


def test_stale_and_out_of_order_observations_are_ignored() -> None:
    state = state_with_a_forecast(forecast_rps=150.0)
    policy_state = make_policy("tideshift").initial_state()
    _, _, policy_state = plan(state, policy_state, NOW)

    # Observed 60 s ago (older than observed_max_age_seconds): no trigger, not planned on.
    assert not state.apply_observed(observed(900.0, NOW), NOW + 60)
    assert state.observed_rps(NOW + 60) == {}
    desired, reason, policy_state = plan(state, policy_state, NOW + 60)
    assert desired == 2, reason
    assert "panic" not in reason

    # A fresh one is used; a late arrival older than it does not replace it.
    state.apply_observed(observed(120.0, NOW + 58), NOW + 60)
    assert not state.apply_observed(observed(990.0, NOW + 50), NOW + 60)
    assert state.observed_rps(NOW + 60) == {WEB: 120.0}
