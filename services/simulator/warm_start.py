"""The tideshift planner as it is after running through the demand before a run's start
(`warm_history_s` of each serving workload; by default the history the forecaster is fitted
on, up to the rise window): a run measures a planner that has been running, or one freshly
installed that read the last day of demand, not one that has just started."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from tideshift.loadgen.core.profiles import RateProfile
from tideshift.services.planner import core as pol
from tideshift.services.planner.core.model import Rises
from tideshift.services.planner.core.serving import warm
from tideshift.services.simulator.scenario import Scenario


def warm_history_s(scenario: Scenario, index: int, config: pol.PolicyConfig) -> float:
    """How much of the demand before t = 0 the `index`-th serving workload's planner saw."""
    chosen = scenario.serving[index].warm_history_s
    if chosen is not None:
        return chosen
    return min(scenario.forecaster.history_s, config.rise_window_s)


def warm_state(
    state: Any,
    scenario: Scenario,
    profiles: Sequence[RateProfile],
    serving: Sequence[pol.ServingWorkload],
    *,
    plan_every_s: float,
) -> Any:
    """`state` with each serving workload's rises derived from its demand before t = 0,
    observed on the plan cadence; any other policy's state as it is."""
    if not isinstance(state, pol.PlanState):
        return state
    config = pol.PolicyConfig()
    rises: dict[pol.Target, Rises] = {}
    for index, (profile, workload) in enumerate(zip(profiles, serving, strict=True)):
        span = warm_history_s(scenario, index, config)
        if span <= 0:
            continue
        observed = warm.sampled(profile.rate, start=-span, end=0.0, every_s=plan_every_s)
        rises[workload.target] = warm.derive(workload, observed, config)
    return warm.warm_state(state, rises)
