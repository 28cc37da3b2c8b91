"""The planner's plan loop (`Planner._plan_loop`) with its plan replaced (no bus): a burst
of cluster events during a plan costs one more plan, on the latest state, and a forecast
does not wait for cluster churn's coalescing window; /readyz says "behind" from the planner's
own backlog. Waits are on conditions."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from types import SimpleNamespace

from tideshift.events import ForecastIssued, ForecastPoint, PodChanged, Resources, WorkloadRef
from tideshift.services.common.bus.drops import SlowConsumers
from tideshift.services.planner.service import BEHIND_FRACTION, Planner
from tideshift.services.planner.settings import PlannerSettings

TIMEOUT_S = 30.0


class GatedPlanner(Planner):
    """Records each plan (trigger and pods in view) and holds it until `gate` opens."""

    def __post_init__(self) -> None:
        super().__post_init__()
        self.planned: list[tuple[str, int]] = []
        self.gate = asyncio.Event()
        self.gate.set()
        self.recorded = asyncio.Condition()

    async def plan_once(self, trigger: str) -> None:
        async with self.recorded:
            self.planned.append((trigger, len(self.state.table)))
            self.recorded.notify_all()
        await self.gate.wait()

    async def began(self, count: int) -> None:
        """Wait until `count` plans began."""
        async with self.recorded:
            await asyncio.wait_for(
                self.recorded.wait_for(lambda: len(self.planned) >= count), TIMEOUT_S
            )


def planner(coalesce_s: float) -> GatedPlanner:
    settings = PlannerSettings(
        health_port=-1, tick_seconds=3600.0, cluster_coalesce_seconds=coalesce_s
    )
    return GatedPlanner(
        bus=None,  # type: ignore[arg-type]  # plan_once is replaced: nothing is published
        settings=settings,
        instance="t",
        stopping=asyncio.Event(),
    )


def pod(index: int) -> PodChanged:
    return PodChanged(
        change="added",
        namespace="shop",
        name=f"p{index}",
        phase="Running",
        node="n1",
        requests=Resources(cpu=0.1),
        observed_at=datetime.now(UTC),
    )


def forecast() -> ForecastIssued:
    now = datetime.now(UTC)
    return ForecastIssued(
        workload=WorkloadRef("shop", "Deployment", "web"),
        model="test",
        issued_at=now,
        step_seconds=60.0,
        points=(ForecastPoint(at=now, point=1.0, q50=1.0, q90=1.0, q95=1.0, q99=1.0),),
    )


async def test_a_burst_during_a_plan_costs_one_more_plan_on_the_latest_state() -> None:
    loop_planner = planner(coalesce_s=0.0)
    loop_planner.gate.clear()
    task = asyncio.create_task(loop_planner._plan_loop())
    try:
        await loop_planner.began(1)  # the first tick's plan, held
        for index in range(3000):
            loop_planner._apply_cluster(loop_planner.state.apply_pod, pod(index))
        loop_planner.gate.set()
        await loop_planner.began(2)
        assert loop_planner.planned[1] == ("change", 3000)
        # That plan took the whole burst in: none is left due, not one per event.
        assert loop_planner.trigger.due_in(loop_planner.clock.now()) is None
    finally:
        loop_planner.stopping.set()
        loop_planner.changed.set()
        await asyncio.wait_for(task, TIMEOUT_S)


async def test_a_forecast_does_not_wait_behind_the_churn_window() -> None:
    loop_planner = planner(coalesce_s=3600.0)  # churn alone would wait an hour
    task = asyncio.create_task(loop_planner._plan_loop())
    try:
        await loop_planner.began(1)
        loop_planner._apply_cluster(loop_planner.state.apply_pod, pod(0))
        assert (loop_planner.trigger.due_in(loop_planner.clock.now()) or 0.0) > 3000
        loop_planner._apply(loop_planner.state.apply_forecast, forecast())
        await loop_planner.began(2)
        assert loop_planner.planned[1] == ("change", 1)
    finally:
        loop_planner.stopping.set()
        loop_planner.changed.set()
        await asyncio.wait_for(task, TIMEOUT_S)


class Waiting:
    """A subscription as the bus's registry sees it: messages the server sent, not yet read."""

    pending_msgs = 0


def test_readiness_says_behind_while_its_own_backlog_is_long_not_for_a_stale_stamp() -> None:
    subscribers = SlowConsumers()
    late_planner = planner(coalesce_s=1.0)
    late_planner.bus = SimpleNamespace(slow_consumers=subscribers)  # type: ignore[assignment]
    queued = [0]
    subscribers.register(Waiting(), "planner-t", None, lambda: queued[0])  # type: ignore[arg-type]
    # An event stamped long ago (a clock apart, a replay) is no sign of a backlog.
    late = pod(0).model_copy(update={"observed_at": datetime.fromtimestamp(0, UTC)})
    late_planner._apply_cluster(late_planner.state.apply_pod, late)
    assert late_planner.readiness() == []
    queued[0] = late_planner.settings.subscription_buffer // BEHIND_FRACTION + 1
    assert late_planner.readiness() == [f"behind: {queued[0]} events waiting to be applied"]
    queued[0] = 0  # caught up
    assert late_planner.readiness() == []
