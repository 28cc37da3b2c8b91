"""The clairvoyant bound (`tideshift simulate --policy oracle`): Tideshift's own planner fed the
scenario's true future demand, with no headroom.

What it knows and does, per plan:

* each serving workload's forecast is the true demand, sampled at every simulator step from now
  to the forecaster's horizon, as every quantile (`TruthForecaster`): the planner's peak over
  the look-ahead window is then the exact peak of what will come;
* the look-ahead window is the workload's lead time (at least its start-up delay, when the
  scenario's lead time is shorter) plus one plan interval plus one step: the replicas a plan
  asks for are ready before the demand they are for, and the next plan comes before the window
  ends, so serving is never short (shortfall 0 by construction, `tests/unit/simulator/
  test_oracle.py`);
* no headroom: the rises the planner learns from observed demand are forgotten before every
  plan (no priced rise, no panic window) and scale-down is not held by a stabilisation
  window; the replicas are whole, at the workload's target utilisation, within its min and
  max replicas. One rule stays, because it is a payback, not a margin: serving releases room
  only when the true demand does not come back for it within the release horizon
  (`release_horizon_s`, the horizon trainers' growth must pay its restart over), since room
  released and taken back minutes later costs trainers two restarts and buys nothing;
* training gets the rest through the planner's own decisions (services/planner/core/: tiers,
  weighted dominant-resource fair shares, gangs, placement, the restart payback that decides
  whether moving trainers pays, batch trainers on serving's idle reservation), which read the
  same true forecast.

So the oracle differs from Tideshift only in what it knows and the safety margin it needs;
each policy's training work, serving replica-hours and churn are reported as a fraction of
the oracle's (`report.py`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

from tideshift.events.models import QUANTILE_LEVELS
from tideshift.loadgen.core.profiles import RateProfile
from tideshift.services.planner import core as pol
from tideshift.services.planner.core.model import Decision, PlanInputs, PlanState

ORACLE = "oracle"


@dataclass
class TruthForecaster:
    """The true demand from `now` on, one point per simulator step up to `horizon_s`, as every
    quantile. Rates are computed once per step index and cached (the run asks each plan)."""

    profile: RateProfile
    step_s: float
    horizon_s: float
    _rates: dict[int, float] = field(default_factory=dict)

    def _rate(self, index: int) -> float:
        rate = self._rates.get(index)
        if rate is None:
            value = self.profile.rate(index * self.step_s)
            # A gap in a trace (NaN) is no demand to serve; a negative rate neither.
            rate = value if math.isfinite(value) and value > 0 else 0.0
            self._rates[index] = rate
        return rate

    def forecast(self, now: float) -> pol.Forecast:
        first = math.floor(now / self.step_s + 1e-9)
        count = max(2, math.ceil(self.horizon_s / self.step_s) + 1)
        times = tuple((first + k) * self.step_s for k in range(count))
        values = tuple(self._rate(first + k) for k in range(count))
        return pol.Forecast(
            issued_at=now, times=times, quantiles={q: values for q in QUANTILE_LEVELS}
        )


@dataclass
class OraclePolicy:
    """Tideshift's planner with a perfect forecast and zero headroom (module docstring). The
    run feeds it the forecasts of its `forecasters` (the truth, in serving order) as it feeds
    every policy its scenario's forecaster's."""

    forecasters: Sequence[TruthForecaster]
    # Per serving workload: the seconds a replica takes from the plan to ready.
    startup_s: Mapping[pol.Target, float]
    plan_every_s: float
    step_s: float
    name: str = ORACLE
    elastic_training: bool = True
    cadence_s: float | None = None

    def initial_state(self) -> PlanState:
        return PlanState()

    def _serving(self, workloads: Sequence[pol.ServingWorkload]) -> tuple[pol.ServingWorkload, ...]:
        exact = []
        for workload in workloads:
            lead = max(workload.lead_time_s, self.startup_s.get(workload.target, 0.0))
            exact.append(
                replace(
                    workload,
                    lead_time_s=lead,
                    margin_s=self.plan_every_s + self.step_s,
                    stabilization_s=0.0,
                )
            )
        return tuple(exact)

    def plan(self, inputs: PlanInputs, state: PlanState, now: float) -> tuple[Decision, PlanState]:
        exact_inputs = replace(inputs, serving=self._serving(inputs.serving))
        # No learned rise, no panic window: the future is known, so no margin is priced.
        clean = replace(state, serving_misses={})
        decision, new_state = pol.plan(exact_inputs, clean, now)
        return decision, replace(new_state, serving_misses={})


def oracle_policy(
    serving: Sequence[pol.ServingWorkload],
    profiles: Sequence[RateProfile],
    startup_s: Sequence[float],
    *,
    plan_every_s: float,
    step_s: float,
    horizon_s: float,
) -> OraclePolicy:
    """The oracle for a scenario's serving workloads and their true demand profiles; the
    forecast covers at least the look-ahead window and `horizon_s` (the restart payback
    reads it that far)."""
    window = max([max(w.lead_time_s, s) for w, s in zip(serving, startup_s, strict=True)] + [0.0])
    horizon = max(horizon_s, window + plan_every_s + 2 * step_s)
    return OraclePolicy(
        forecasters=tuple(TruthForecaster(p, step_s, horizon) for p in profiles),
        startup_s={w.target: s for w, s in zip(serving, startup_s, strict=True)},
        plan_every_s=plan_every_s,
        step_s=step_s,
    )


def ratio(value: float, oracle: float) -> float:
    """`value` as a fraction of the oracle's: 1 when both are 0, NaN when only the oracle's is
    (no ratio; null in JSON)."""
    if oracle > 0:
        return value / oracle
    return 1.0 if value == 0 else float("nan")


def versus_oracle(
    figures: Mapping[str, tuple[float, float, float]],
) -> dict[str, dict[str, float]]:
    """Per policy, its (training work, serving replica-hours, trainer churn) as fractions of
    the oracle's; empty when the oracle did not run."""
    if ORACLE not in figures:
        return {}
    work, replica_h, churn = figures[ORACLE]
    return {
        name: {
            "training_work_vs_oracle": ratio(w, work),
            "serving_replica_hours_vs_oracle": ratio(r, replica_h),
            "churn_vs_oracle": ratio(c, churn),
        }
        for name, (w, r, c) in figures.items()
    }
