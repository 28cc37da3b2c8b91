"""When the planner plans (`PlanTrigger`): urgent changes as soon as the plan in flight ends,
cluster churn coalesced into one plan `cluster_s` (or as long as the last plan took) after
the last one ended, a burst costs one more plan. Time is an argument: no clock."""

from __future__ import annotations

import pytest

from tideshift.services.planner.core.state import PlanTrigger

NOW = 1000.0


def test_nothing_changed_nothing_is_due() -> None:
    assert PlanTrigger(debounce_s=0.0, cluster_s=1.0).due_in(NOW) is None


def test_an_urgent_change_is_due_at_once_after_any_plan() -> None:
    trigger = PlanTrigger(debounce_s=0.0, cluster_s=1.0)
    trigger.start(NOW)
    trigger.mark(urgent=True)
    assert trigger.due_in(NOW + 0.01) == 0.0


def test_cluster_churn_waits_for_the_coalescing_window_from_the_last_plan() -> None:
    trigger = PlanTrigger(debounce_s=0.0, cluster_s=1.0)
    trigger.start(NOW)
    trigger.finish(NOW + 0.1)
    trigger.mark(urgent=False)
    assert trigger.due_in(NOW + 0.25) == pytest.approx(0.85)  # a window after it ended
    assert trigger.due_in(NOW + 2.0) == 0.0


def test_churn_after_a_long_plan_waits_as_long_as_that_plan_took() -> None:
    trigger = PlanTrigger(debounce_s=0.0, cluster_s=1.0)
    trigger.start(NOW)
    trigger.finish(NOW + 3.0)  # a loaded machine: plans must not take all of its time
    trigger.mark(urgent=False)
    assert trigger.due_in(NOW + 3.0) == 3.0
    trigger.mark(urgent=True)  # but a forecast does not wait
    assert trigger.due_in(NOW + 3.0) == 0.0


def test_a_burst_of_churn_makes_one_plan_and_a_forecast_cuts_the_wait() -> None:
    trigger = PlanTrigger(debounce_s=0.0, cluster_s=1.0)
    trigger.start(NOW)
    trigger.finish(NOW)
    for _ in range(5000):
        trigger.mark(urgent=False)
    assert trigger.due_in(NOW + 0.5) == 0.5
    trigger.mark(urgent=True)
    assert trigger.due_in(NOW + 0.5) == 0.0
    trigger.start(NOW + 0.5)  # that plan takes in the whole burst
    assert trigger.due_in(NOW + 0.6) is None


def test_debounce_spaces_even_urgent_plans() -> None:
    trigger = PlanTrigger(debounce_s=2.0, cluster_s=1.0)
    trigger.start(NOW)
    trigger.mark(urgent=True)
    assert trigger.due_in(NOW + 0.5) == 1.5
    trigger.mark(urgent=False)
    assert trigger.due_in(NOW + 0.5) == 1.5
