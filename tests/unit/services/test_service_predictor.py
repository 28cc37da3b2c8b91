"""The predictor service on the in-memory bus and virtual time: a configured workload gets a
forecast and observed demand at once, and the next ones when their intervals have passed in
clock time (not before); a workload the watcher announces is forecast too."""

from __future__ import annotations

import functools
from typing import Any

from tests.fixtures.support import collect, eventually, running
from tideshift import events
from tideshift.services.common.bus.memory import MemoryBroker, MemoryBus
from tideshift.services.common.clock import ManualClock, utc_now
from tideshift.services.predictor import service as predictor_service
from tideshift.services.predictor.settings import PredictorSettings, WorkloadQuery
from tideshift.services.predictor.sources import SimMetricSource

NS = "shop"
REFRESH_S = 1800.0
OBSERVE_S = 600.0


def settings(**overrides: Any) -> PredictorSettings:
    fields: dict[str, Any] = {
        "health_port": -1,
        "metric_source": "sim",
        "model": "seasonal_naive_daily",
        "workloads": [WorkloadQuery(namespace=NS, name="web")],
        "step_seconds": 300.0,
        "horizon_seconds": 3600.0,
        "history_seconds": 2 * 86400.0,
        "refresh_seconds": REFRESH_S,
        "observe_seconds": OBSERVE_S,
    }
    return PredictorSettings(**(fields | overrides))


async def test_forecasts_and_observed_demand_come_on_clock_time(
    broker: MemoryBroker, bus: MemoryBus, clock: ManualClock
) -> None:
    forecasts: list[events.ForecastIssued] = []
    observed: list[events.DemandObserved] = []
    tasks = [
        await collect(bus, events.FORECAST.filter(), forecasts),
        await collect(bus, events.DEMAND_OBSERVED.filter(), observed),
    ]
    chosen = settings()
    body = functools.partial(
        predictor_service.serve, chosen, clock=clock, source=SimMetricSource(lambda _: 120.0)
    )
    async with running(broker, "predictor", chosen, body):
        await eventually(lambda: forecasts and observed, timeout=30)
        first = forecasts[0]
        assert first.workload.name == "web"
        assert first.issued_at.timestamp() == clock.now()
        assert abs(first.points[0].point - 120.0) < 1.0
        assert observed[0].observed_at.timestamp() == clock.now()

        # Before the intervals pass, nothing more; after them, one more of each.
        await clock.advance(OBSERVE_S - 1)
        assert (len(forecasts), len(observed)) == (1, 1)
        await clock.advance(1)
        await eventually(lambda: len(observed) == 2)
        assert len(forecasts) == 1
        await clock.advance(REFRESH_S - OBSERVE_S)
        await eventually(lambda: len(forecasts) == 2, timeout=30)
        assert forecasts[1].issued_at.timestamp() - first.issued_at.timestamp() == REFRESH_S
    for task in tasks:
        task.cancel()


async def test_an_announced_workload_is_forecast(
    broker: MemoryBroker, bus: MemoryBus, clock: ManualClock
) -> None:
    forecasts: list[events.ForecastIssued] = []
    task = await collect(bus, events.FORECAST.filter(), forecasts)
    chosen = settings(workloads=[])
    body = functools.partial(
        predictor_service.serve, chosen, clock=clock, source=SimMetricSource(lambda _: 80.0)
    )
    async with running(broker, "predictor", chosen, body):
        announced = events.WorkloadChanged(
            change="added",
            workload=events.WorkloadRef(kind="Deployment", namespace=NS, name="api"),
            role="serving",
            replicas=1,
            requests=events.Resources(cpu=0.1),
            serving=events.ServingPolicy(capacity_rps=10),
            observed_at=utc_now(clock),
        )
        await bus.publish(
            events.WORKLOAD_CHANGED.at(namespace=NS, kind="Deployment", name="api"), announced
        )
        await eventually(lambda: [f for f in forecasts if f.workload.name == "api"], timeout=30)
    task.cancel()
