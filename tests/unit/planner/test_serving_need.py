"""Serving's need a plan publishes for the quota lent to Kueue
(core/lending/serving_need.py): reserved at the plan's sizes, expected at the median
forecast's peak over the lead time (at least what runs), `other` what else the plan places."""

from __future__ import annotations

import numpy as np

from tideshift.services.planner.core import ClusterView, NodeSpec, PlanInputs, PlanState, Target
from tideshift.services.planner.core.lending.serving_need import serving_need
from tideshift.services.planner.core.model import Forecast, PodSpec, ServingWorkload
from tideshift.services.planner.core.plan import plan

GIB = 2.0**30
NOW = 10_000.0
WEB = ServingWorkload(
    Target("shop", "Deployment", "web"), (1.0, GIB, 0.0), 100.0, 1, 20, lead_time_s=60.0
)


def inputs(median: float, q95: float, *, running: int, other_cpu: float = 0.0) -> PlanInputs:
    times = tuple(NOW + 60.0 * i for i in range(10))
    forecast = Forecast(NOW, times, {0.5: (median,) * 10, 0.95: (q95,) * 10})
    pods = [PodSpec((other_cpu, 0.0, 0.0), node="n1")] if other_cpu else []
    cluster = ClusterView.build([NodeSpec("n1", (16.0, 64 * GIB, 0.0))], pods)
    return PlanInputs(cluster, (WEB,), (), {WEB.target: forecast}, {WEB.target: running})


def test_reserved_follows_the_plan_and_expected_the_median() -> None:
    given = inputs(300.0, 800.0, running=2, other_cpu=1.5)
    decision, _ = plan(given, PlanState(), NOW)
    need = serving_need(given, decision, NOW)
    sized = decision.desired()[WEB.target]
    assert sized >= 8  # the q95 sizes serving
    np.testing.assert_allclose(need.capacity, (16.0, 64 * GIB, 0.0))
    np.testing.assert_allclose(need.reserved, (sized, sized * GIB, 0.0))
    np.testing.assert_allclose(need.expected, (3.0, 3 * GIB, 0.0))  # the median's 3
    np.testing.assert_allclose(need.other[0], 1.5)  # the pod of no target


def test_expected_is_never_below_what_runs_nor_above_the_reservation() -> None:
    given = inputs(100.0, 400.0, running=6)
    decision, _ = plan(given, PlanState(), NOW)
    need = serving_need(given, decision, NOW)
    assert need.expected[0] == 6.0  # 6 run though the median needs 1
    assert need.reserved[0] >= need.expected[0]
