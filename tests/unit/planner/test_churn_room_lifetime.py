"""Growth priced over the room's lifetime (issue 26, trainer churn): room serving leaves free
lasts until serving's forecast (its upper quantile over the look-ahead window, or the median
times the priced rise) calls for it again; a trainer growth into it costs two restarts (one to
grow, one when serving takes the room back) and waits when the room will not last long enough
to pay them; the reason says so."""

from __future__ import annotations

import numpy as np
import pytest

from tideshift.services.planner.core import (
    ClusterView,
    NodeSpec,
    PlanInputs,
    PlanState,
    PodSpec,
    PolicyConfig,
    Target,
    TrainingJob,
    plan,
)
from tideshift.services.planner.core.model import Forecast, ServingWorkload
from tideshift.services.planner.core.training.lifetime import Reclaim, expected_reclaim
from tideshift.services.planner.core.training.shares import TierJob
from tideshift.services.planner.core.training.tier import defer_small_growth, growth_gain

GIB = 2**30
WEB = Target("apps", "Deployment", "web")
JOB = Target("ml", "PyTorchJob", "job")
NOW = 6000.0
CONFIG = PolicyConfig()
TOTAL = np.array([100.0, 400 * GIB, 0.0])
REPLICA = (1.0, GIB, 0.0)


def web(**overrides: float) -> ServingWorkload:
    fields: dict[str, float] = {"capacity_rps": 100.0, "min_replicas": 1, "max_replicas": 16}
    fields.update(overrides)
    return ServingWorkload(WEB, REPLICA, **fields)  # type: ignore[arg-type]


def forecast(
    median: list[float], upper: list[float] | None = None, *, issued_at: float = NOW
) -> Forecast:
    times = tuple(NOW + 60.0 * i for i in range(len(median)))
    return Forecast(issued_at, times, {0.5: tuple(median), 0.95: tuple(upper or median)})


def test_room_lasts_until_the_upper_forecast_over_the_look_ahead_window_needs_it() -> None:
    # The q0.95 reaches 700 req/s at +300 s; the window (lead 60 s + margin 60 s) sees it at
    # +180 s: serving then wants 7 replicas, 3 more than the 4 this plan gives it.
    ahead = forecast([400.0] * 10, [400.0] * 5 + [700.0] * 5)
    reclaim = expected_reclaim((web(),), {WEB: ahead}, [4], {}, now=NOW, config=CONFIG)
    assert reclaim.lifetime(np.zeros(3)) == 180.0
    assert reclaim.lifetime(np.array([2.0, 2 * GIB, 0.0])) == 180.0
    assert reclaim.lifetime(np.array([3.0, 3 * GIB, 0.0])) is None  # 3 cores stay free


def test_the_priced_rise_on_the_median_takes_room_back_too() -> None:
    # The median rises to 500 req/s at +600 s; at a rise ratio of 1.5 serving wants 8 then.
    ahead = forecast([400.0] * 10 + [500.0] * 5)
    reclaim = expected_reclaim((web(),), {WEB: ahead}, [6], {WEB: 1.5}, now=NOW, config=CONFIG)
    assert reclaim.lifetime(np.zeros(3)) == 600.0  # 400 x 1.5 needs the 6 it has until then
    assert reclaim.lifetime(np.array([1.0, GIB, 0.0])) == 600.0
    assert reclaim.lifetime(np.array([2.0, 2 * GIB, 0.0])) is None


def test_a_stale_or_missing_forecast_sees_nothing() -> None:
    stale = forecast([400.0] * 5, [900.0] * 5, issued_at=NOW - CONFIG.max_forecast_age_s - 1)
    for forecasts in ({WEB: stale}, {}):
        reclaim = expected_reclaim((web(),), forecasts, [4], {}, now=NOW, config=CONFIG)
        assert reclaim.lifetime(np.zeros(3)) is None


def test_needs_of_several_workloads_add_up_at_each_time() -> None:
    other = Target("apps", "Deployment", "api")
    workloads = (web(), ServingWorkload(other, REPLICA, capacity_rps=100.0, max_replicas=16))
    forecasts = {
        WEB: forecast([100.0] * 10, [100.0] * 4 + [300.0] * 6),  # +2 from +120 s
        other: forecast([100.0] * 10, [100.0] * 6 + [300.0] * 4),  # +2 more from +240 s
    }
    reclaim = expected_reclaim(workloads, forecasts, [1, 1], {}, now=NOW, config=CONFIG)
    assert reclaim.lifetime(np.array([1.0, GIB, 0.0])) == 120.0
    assert reclaim.lifetime(np.array([3.0, 3 * GIB, 0.0])) == 240.0


def test_a_growth_pays_when_the_room_outlasts_its_two_restarts() -> None:
    before, after = 8**0.8, 16**0.8
    assert growth_gain(before, after, lifetime_s=600.0, cost_s=30.0) > 0
    assert growth_gain(before, after, lifetime_s=60.0, cost_s=30.0) < 0
    assert growth_gain(before, after, lifetime_s=600.0, cost_s=30.0) == pytest.approx(
        570.0 * after - 630.0 * before
    )


def tier_job(current: int) -> TierJob:
    job = TrainingJob(JOB, (1.0, GIB, 0.0), 1, 64, restart_cost_s=30.0)
    return TierJob(job, current, np.array([1.0, GIB, 0.0]), current, 0.01)


def grow_8_to_16(reclaimed_after_s: float, cores: float) -> tuple[list[int], dict[int, str]]:
    """A job of 8 trainers whose fair share is 16, with no room left beyond them, when
    serving takes `cores` back after `reclaimed_after_s`."""
    reclaim = Reclaim(np.array([reclaimed_after_s]), np.array([[cores, cores * GIB, 0.0]]))
    return defer_small_growth(
        [tier_job(8)],
        [16],
        skip=set(),
        total=TOTAL,
        config=CONFIG,
        reclaim=reclaim,
        leftover=np.zeros(3),
    )


def test_growth_into_room_serving_takes_back_too_soon_waits_and_says_why() -> None:
    counts, deferred = grow_8_to_16(60.0, 8.0)
    assert counts == [8]
    assert deferred[0] == (
        "growth by 8 deferred: serving is expected to take the room back in 60 s, before the "
        "growth pays its two 30 s restarts"
    )


def test_growth_is_cut_to_the_part_whose_room_lasts() -> None:
    # Serving takes 5 cores back in 60 s: the first 3 new trainers stand on room it leaves.
    counts, deferred = grow_8_to_16(60.0, 5.0)
    assert counts == [11]
    assert deferred[0].startswith("growth by 8 cut to 3: serving is expected to take the room")


def test_growth_into_room_that_lasts_goes_ahead() -> None:
    assert grow_8_to_16(1200.0, 8.0) == ([16], {})


def plan_beside_web(upper: list[float]) -> tuple[int, str]:
    """One 16-core node: web holds 4 replicas (400 req/s), the job 4 trainers; 8 cores free."""
    node = NodeSpec("n0", (16.0, 64 * GIB, 0.0))
    pods = [PodSpec(REPLICA, "n0", WEB) for _ in range(4)]
    pods += [PodSpec((1.0, GIB, 0.0), "n0", JOB) for _ in range(4)]
    job = TrainingJob(JOB, (1.0, GIB, 0.0), 1, 12, restart_cost_s=120.0)
    inputs = PlanInputs(
        cluster=ClusterView.build([node], pods),
        serving=(web(),),
        jobs=(job,),
        forecasts={WEB: forecast([400.0] * len(upper), upper)},
        current={WEB: 4, JOB: 4},
    )
    decision, _ = plan(inputs, PlanState(), NOW)
    item = next(item for item in decision.targets if item.target == JOB)
    return item.desired, item.reason


def test_the_plan_grows_training_only_into_room_serving_keeps_long_enough() -> None:
    desired, reason = plan_beside_web([400.0] * 5 + [1200.0] * 5)
    assert desired == 4
    assert "take the room back in 180 s" in reason
    desired, _ = plan_beside_web([400.0] * 30)
    assert desired == 12
