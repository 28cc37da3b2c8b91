"""The predictor forecasts a serving workload the watcher announces at once, with the demand
query from its annotation, and drops it when it is removed; settings win on conflict."""

from __future__ import annotations

import asyncio
import contextlib
from datetime import UTC, datetime

from tideshift.events import (
    FORECAST,
    Resources,
    ServingPolicy,
    TrainingPolicy,
    WorkloadChanged,
    WorkloadRef,
)
from tideshift.services.common.bus import Bus
from tideshift.services.common.clock import WallClock
from tideshift.services.common.runtime import ServiceContext
from tideshift.services.predictor.service import Fleet, build_source
from tideshift.services.predictor.settings import PredictorSettings, WorkloadQuery


def announced(ref: WorkloadRef, change: str = "added", query: str = "") -> WorkloadChanged:
    return WorkloadChanged(
        change=change,  # type: ignore[arg-type]
        workload=ref,
        role="serving",
        replicas=1,
        requests=Resources(cpu=0.1),
        serving=ServingPolicy(capacity_rps=10, demand_query=query),
        observed_at=datetime.now(UTC),
    )


async def test_announced_serving_workloads_are_forecast_at_once_and_dropped_on_removal(
    bus: Bus, unique: str
) -> None:
    settings = PredictorSettings(
        metric_source="sim",
        # Which workloads get forecast is under test, not the model: a cheap one keeps the
        # first forecast from waiting on statsforecast's one-off compilation in a fresh venv.
        model="tidal",
        workloads=[WorkloadQuery(namespace=unique, name="static", query="static_rps")],
        step_seconds=60.0,
        horizon_seconds=600.0,
        history_seconds=86400.0,
        refresh_seconds=0.2,
        health_port=-1,
    )
    context = ServiceContext(name="predictor", settings=settings, bus=bus, instance="t")
    received: list[str] = []
    got = asyncio.Event()

    async def listen() -> None:
        async for envelope in bus.subscribe(FORECAST.filter(namespace=unique), consumer="t"):
            received.append(str(envelope.data.workload))
            got.set()

    listener = asyncio.create_task(listen())
    await asyncio.sleep(0)
    await bus.flush()
    fleet = Fleet(settings, context, clock=WallClock(), source=build_source(settings))
    web = WorkloadRef(unique, "Deployment.apps", "web")
    static = WorkloadRef(unique, "Deployment", "static")
    try:
        fleet.start(settings.workloads[0])
        fleet.apply(announced(web, query='sum(rate(requests_total{app="web"}[1m]))'))
        fleet.apply(announced(static, query="ignored"))  # the settings' query stands
        training = announced(WorkloadRef(unique, "Job.batch", "train")).model_copy(
            update={"role": "training", "serving": None, "training": TrainingPolicy()}
        )
        fleet.apply(training)  # not a serving workload: nothing to forecast
        async with asyncio.timeout(30):
            while str(web) not in received:
                got.clear()
                await got.wait()
        assert set(fleet.loops) == {web, static}
        assert fleet.loops[web][0].query == 'sum(rate(requests_total{app="web"}[1m]))'
        assert fleet.loops[static][0].query == "static_rps"

        fleet.apply(announced(web, change="deleted"))
        assert set(fleet.loops) == {static}
    finally:
        await fleet.stop_all()
        listener.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await listener
