"""The safety net across services: the real predictor reads a real Prometheus and publishes
observed demand on a real nats-server; the real planner sizes serving for it at once, and
dead-letters observations that break the contract."""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import time
from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime
from typing import Any

import pytest

from tests.fixtures.prometheus import PrometheusServer, RateExporter
from tideshift.events import (
    DEAD_LETTER,
    DEMAND_OBSERVED,
    NODE_CHANGED,
    PLAN_DECIDED,
    DemandObserved,
    NodeChanged,
    PlanDecided,
    Resources,
    WorkloadRef,
    encode,
)
from tideshift.services.common.bus import Bus
from tideshift.services.common.runtime import ServiceContext
from tideshift.services.planner.service import Planner
from tideshift.services.planner.settings import PlannerSettings, ServingTarget
from tideshift.services.predictor.service import serve as run
from tideshift.services.predictor.settings import PredictorSettings

pytestmark = pytest.mark.timeout(300)

PHASE_TIMEOUT_S = 90.0
CAPACITY_RPS = 10.0
BASE_RPS, SPIKE_RPS = 20.0, 300.0


class Received:
    """Events of one subject gathered in the background, for waiting on conditions."""

    def __init__(self) -> None:
        self.items: list[Any] = []
        self.arrived = asyncio.Event()

    async def wait_for(self, condition: Callable[[Any], bool], *, what: str) -> Any:
        deadline = time.monotonic() + PHASE_TIMEOUT_S
        while True:
            found = next((item for item in self.items if condition(item)), None)
            if found is not None:
                return found
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise AssertionError(f"nothing {what}; last: {self.items[-1:]}")
            self.arrived.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.arrived.wait(), remaining)


@contextlib.asynccontextmanager
async def listening(bus: Bus, subject: Any, consumer: str) -> AsyncIterator[Received]:
    received = Received()

    async def listen() -> None:
        async for envelope in bus.subscribe(subject, consumer=consumer):
            received.items.append(envelope.data)
            received.arrived.set()

    task = asyncio.create_task(listen())
    for _ in range(5):
        await asyncio.sleep(0)
    await bus.flush()
    try:
        yield received
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


@contextlib.asynccontextmanager
async def running_services(bus: Bus, unique: str, prometheus_url: str) -> AsyncIterator[Planner]:
    predictor_settings = PredictorSettings(
        prometheus_url=prometheus_url,
        workloads=[{"namespace": unique, "name": "web"}],
        query_template='sum(rate(http_requests_total{app="$name"}[4s]))',
        step_seconds=1.0,
        horizon_seconds=10.0,
        history_seconds=600.0,
        refit_seconds=15.0,
        refresh_seconds=1.0,
        observe_seconds=0.5,
        query_timeout_seconds=2.0,
        stale_after_seconds=4.0,
        health_port=-1,
    )
    planner_settings = PlannerSettings(
        serving=[
            ServingTarget(
                namespace=unique,
                name="web",
                cpu=1.0,
                capacity_rps=CAPACITY_RPS,
                min_replicas=1,
                max_replicas=100,
                lead_time_s=2.0,
                margin_s=2.0,
            )
        ],
        tick_seconds=600.0,  # plans come from changes here, not from the tick
        lease_name=f"planner-{unique}",
        lease_ttl_seconds=1.0,
        snapshot_bucket=f"snapshot_{unique}",
        observed_max_age_seconds=5.0,
        health_port=-1,
    )
    planner = Planner(bus, planner_settings, f"planner-{unique}", asyncio.Event())
    planner_task = asyncio.create_task(planner.run())
    context = ServiceContext(
        name="predictor", settings=predictor_settings, bus=bus, instance="test"
    )
    predictor_task = asyncio.create_task(run(predictor_settings, context))
    try:
        await asyncio.wait_for(planner.ready.wait(), 15)
        yield planner
    finally:
        context.stopping.set()
        planner.stopping.set()
        await asyncio.wait_for(asyncio.gather(predictor_task, planner_task), 30)


def web_decision(plan: PlanDecided, name: str = "web") -> Any:
    return next((item for item in plan.targets if item.target.name == name), None)


@pytest.mark.prometheus
async def test_observed_demand_above_the_plan_scales_serving_at_once(
    bus: Bus, unique: str, rate_exporter: RateExporter, prometheus_server: PrometheusServer
) -> None:
    rate_exporter.set_rate(BASE_RPS)
    async with (
        listening(bus, DEMAND_OBSERVED.filter(namespace=unique), f"o-{unique}") as observed,
        listening(bus, PLAN_DECIDED.filter(), f"p-{unique}") as plans,
        running_services(bus, unique, prometheus_server.url) as planner,
    ):
        await bus.publish(
            NODE_CHANGED.at(name=f"n-{unique}"),
            NodeChanged(
                change="added",
                name=f"n-{unique}",
                allocatable=Resources(cpu=500.0, memory=2**40),
                observed_at=datetime.now(UTC),
            ),
        )
        first: DemandObserved = await observed.wait_for(
            lambda event: abs(event.rps - BASE_RPS) <= 0.2 * BASE_RPS,
            what=f"observed near {BASE_RPS} req/s",
        )
        assert first.workload.namespace == unique
        # A plan on the forecast alone first, allowing for well below the spike.
        await plans.wait_for(
            lambda plan: (
                (item := web_decision(plan)) is not None
                and "forecast" in item.reason
                and item.desired * CAPACITY_RPS <= SPIKE_RPS / 3
            ),
            what="planned from a settled forecast",
        )
        assert {t.name for t in planner.state.allowed_rps} == {"web"}

        rate_exporter.set_rate(SPIKE_RPS)
        spike: DemandObserved = await observed.wait_for(
            lambda event: event.rps >= 0.9 * SPIKE_RPS, what=f"observed near {SPIKE_RPS} req/s"
        )
        needed = math.ceil(spike.rps / CAPACITY_RPS - 1e-9)
        # Sized for the observation, and the reason names the miss, not the forecast alone.
        covering = await plans.wait_for(
            lambda plan: (
                (item := web_decision(plan)) is not None
                and item.desired >= needed
                and ("miss headroom" in item.reason or "panic" in item.reason)
            ),
            what=f"a plan covering the spike ({needed} replicas) from observed demand",
        )
        assert web_decision(covering).desired * CAPACITY_RPS >= spike.rps


async def test_an_observation_breaking_the_contract_is_dead_lettered_and_the_next_applies(
    bus: Bus, unique: str
) -> None:
    await bus.ensure_streams()
    settings = PlannerSettings(
        lease_name=f"planner-{unique}",
        snapshot_bucket=f"snapshot_{unique}",
        health_port=-1,
    )
    planner = Planner(bus, settings, f"planner-{unique}", asyncio.Event())
    web = WorkloadRef(kind="Deployment", namespace=unique, name="web")
    subject = DEMAND_OBSERVED.at(namespace=unique, workload="web")

    def observation(rps: float) -> DemandObserved:
        return DemandObserved(workload=web, rps=rps, observed_at=datetime.now(UTC))

    bad = json.loads(encode(observation(1.0), source="test"))
    bad["data"]["rps"] = -5.0
    async with listening(bus, DEAD_LETTER.at(consumer=f"planner-{planner.instance}"), "dl") as dead:
        task = asyncio.create_task(planner.run())
        try:
            await asyncio.wait_for(planner.ready.wait(), 15)
            await bus.connection.publish(subject.value, json.dumps(bad).encode())
            letter = await dead.wait_for(lambda _: True, what="dead-lettered")
            assert letter.original_subject == subject.value
            assert "rps" in letter.reason
            await bus.publish(subject, observation(42.0))
            deadline = time.monotonic() + PHASE_TIMEOUT_S
            while web not in planner.state.observed:  # applied by the planner's own task
                if time.monotonic() > deadline:
                    raise AssertionError("the valid observation after the bad one never applied")
                await asyncio.sleep(0.02)
            assert planner.state.observed[web][0] == 42.0
        finally:
            planner.stopping.set()
            await asyncio.wait_for(task, 15)
