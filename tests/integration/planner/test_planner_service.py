"""The planner service against a real nats-server: bootstrap from the KV snapshot, commands
only on real differences, lease hand-over, stale-input fallback."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from tests.fixtures.support import serving_web
from tideshift.events import (
    FORECAST,
    NODE_CHANGED,
    PLAN_DECIDED,
    PLANNER_STATUS,
    POD_CHANGED,
    SCALE_COMMAND,
    ForecastIssued,
    ForecastPoint,
    NodeChanged,
    PlanDecided,
    PlannerStatus,
    PodChanged,
    Resources,
    ScaleCommand,
    WorkloadRef,
)
from tideshift.services.common.bus import Bus
from tideshift.services.planner.service import Planner
from tideshift.services.planner.settings import PlannerSettings, TrainingTarget

GIB = 2**30


def settings_for(unique: str, **overrides: Any) -> PlannerSettings:
    fields: dict[str, Any] = {
        "serving": [serving_web(unique)],
        "training": [
            TrainingTarget(
                namespace=unique, name="train", cpu=1.0, memory=GIB, min_trainers=2, max_trainers=20
            )
        ],
        "tick_seconds": 0.3,
        "debounce_seconds": 0.05,
        "lease_name": f"planner-{unique}",
        "lease_ttl_seconds": 1.0,
        "snapshot_bucket": f"snapshot_{unique}",
        "health_port": -1,
    }
    fields.update(overrides)
    return PlannerSettings(**fields)


def forecast(unique: str, rps: float, *, issued: datetime | None = None) -> ForecastIssued:
    issued = issued or datetime.now(UTC)
    points = tuple(
        ForecastPoint(
            at=issued + timedelta(seconds=60 * k), point=rps, q50=rps, q90=rps, q95=rps, q99=rps
        )
        for k in range(10)
    )
    return ForecastIssued(
        workload=WorkloadRef(kind="Deployment", namespace=unique, name="web"),
        issued_at=issued,
        step_seconds=60,
        model="test",
        points=points,
    )


def node(name: str, cpu: float) -> NodeChanged:
    return NodeChanged(
        change="added",
        name=name,
        allocatable=Resources(cpu=cpu, memory=64 * GIB),
        observed_at=datetime.now(UTC),
    )


class Collector:
    """Events of one subject, gathered by a background task."""

    def __init__(self) -> None:
        self.items: list[Any] = []
        self.task: asyncio.Task[None] | None = None

    async def start(self, bus: Bus, subject: Any, consumer: str) -> None:
        async def run() -> None:
            async for envelope in bus.subscribe(subject, consumer=consumer):
                self.items.append(envelope.data)

        self.task = asyncio.create_task(run())
        for _ in range(5):
            await asyncio.sleep(0)
        await bus.flush()

    async def stop(self) -> None:
        if self.task is not None:
            self.task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self.task


async def eventually(predicate: Callable[[], bool], timeout: float = 15.0) -> None:
    """Wait for a condition (polled), failing after `timeout` seconds."""
    deadline = asyncio.get_running_loop().time() + timeout
    while not predicate():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError("condition not reached in time")
        await asyncio.sleep(0.02)


@contextlib.asynccontextmanager
async def running(bus: Bus, settings: PlannerSettings, instance: str) -> AsyncIterator[Planner]:
    planner = Planner(bus, settings, instance, asyncio.Event())
    task = asyncio.create_task(planner.run())
    try:
        await asyncio.wait_for(planner.ready.wait(), 15)
        yield planner
    finally:
        planner.stopping.set()
        await asyncio.wait_for(task, 15)


@pytest.fixture
async def collectors(bus: Bus, unique: str) -> AsyncIterator[dict[str, Collector]]:
    found = {"commands": Collector(), "plans": Collector(), "status": Collector()}
    await found["commands"].start(bus, SCALE_COMMAND.filter(namespace=unique), f"c-{unique}")
    await found["plans"].start(bus, PLAN_DECIDED.filter(), f"p-{unique}")
    await found["status"].start(bus, PLANNER_STATUS.filter(), f"s-{unique}")
    yield found
    for collector in found.values():
        await collector.stop()


def commands_for(collector: Collector, name: str) -> list[ScaleCommand]:
    return [c for c in collector.items if isinstance(c, ScaleCommand) and c.target.name == name]


async def test_commands_only_on_real_differences(
    bus: Bus, unique: str, collectors: dict[str, Collector]
) -> None:
    settings = settings_for(unique)
    # A node that only the snapshot knows about: the planner must bootstrap from it.
    kv = await bus.kv(settings.snapshot_bucket)
    await kv.put(f"node.n-{unique}", node(f"n-{unique}", 16.0))
    async with running(bus, settings, f"a-{unique}") as planner:
        # The job's parameter server: a fixed companion (by name), not a trainer.
        pserver = PodChanged(
            change="added",
            namespace=unique,
            name="train-ps-0",
            phase="Running",
            node=f"n-{unique}",
            owner=WorkloadRef(kind="PyTorchJob", namespace=unique, name="train"),
            role="training",
            requests=Resources(cpu=1.0, memory=GIB),
            observed_at=datetime.now(UTC),
        )
        await bus.publish(POD_CHANGED.at(namespace=unique, name="train-ps-0"), pserver)
        await eventually(lambda: len(planner.state.table) == 1)
        await bus.publish(FORECAST.at(namespace=unique, workload="web"), forecast(unique, 500.0))
        commands = collectors["commands"]
        # Planning is on the leading edge: the pod's own plan (no forecast yet: web held at
        # its minimum) may come before the forecast's. Each command is a real difference.
        await eventually(
            lambda: (
                [c.desired for c in commands_for(commands, "web")][-1:] == [5]
                and [c.desired for c in commands_for(commands, "train")][-1:] == [10]
            )  # 16 - 5 - 1
        )
        for name in ("web", "train"):
            sent = [c.desired for c in commands_for(commands, name)]
            assert all(a != b for a, b in itertools.pairwise(sent)), sent
        assert "forecast" in commands_for(commands, "web")[-1].reason
        web_sent, train_sent = (
            len(commands_for(commands, "web")),
            len(commands_for(commands, "train")),
        )

        # More plans on unchanged inputs (ticks and a re-sent identical forecast): no command.
        await bus.publish(FORECAST.at(namespace=unique, workload="web"), forecast(unique, 500.0))
        plans_before = planner.plans
        await eventually(lambda: planner.plans >= plans_before + 4)
        assert len(commands_for(commands, "web")) == web_sent
        assert len(commands_for(commands, "train")) == train_sent

        # Demand rises: serving goes up at once, training gives way.
        await bus.publish(FORECAST.at(namespace=unique, workload="web"), forecast(unique, 800.0))
        await eventually(lambda: len(commands_for(commands, "web")) == web_sent + 1)
        await eventually(lambda: len(commands_for(commands, "train")) == train_sent + 1)
        assert commands_for(commands, "web")[-1].desired == 8
        assert commands_for(commands, "train")[-1].desired == 7
        plans = [p for p in collectors["plans"].items if isinstance(p, PlanDecided)]
        assert plans and all(len(p.targets) == 2 for p in plans)


async def test_lease_hand_over(bus: Bus, unique: str, collectors: dict[str, Collector]) -> None:
    settings = settings_for(unique)
    await bus.publish(NODE_CHANGED.at(name=f"n-{unique}"), node(f"n-{unique}", 8.0))
    first = Planner(bus, settings, f"first-{unique}", asyncio.Event())
    first_task = asyncio.create_task(first.run())
    await eventually(lambda: first.leader)
    async with running(bus, settings, f"second-{unique}") as second:
        await eventually(lambda: second.plans >= 3)
        assert not second.leader
        # The passive planner plans (its state stays warm) but publishes nothing.
        await bus.publish(FORECAST.at(namespace=unique, workload="web"), forecast(unique, 300.0))
        commands = collectors["commands"]
        await eventually(lambda: bool(commands_for(commands, "web")))
        assert {c.plan_id.rsplit("-", 1)[0] for c in commands.items} == {f"first-{unique}"}

        first.stopping.set()
        await asyncio.wait_for(first_task, 15)  # releases the lease on the way out
        await eventually(lambda: second.leader)
        status = collectors["status"].items
        await eventually(
            lambda: any(
                isinstance(s, PlannerStatus) and s.planner == f"second-{unique}" and s.leader
                for s in status
            )
        )
        # The new leader does not know what the old one sent: it re-issues the plan.
        await eventually(
            lambda: any(c.plan_id.startswith(f"second-{unique}") for c in commands.items)
        )


async def test_stale_forecast_holds_serving_and_stops_training_growth(
    bus: Bus, unique: str, collectors: dict[str, Collector]
) -> None:
    settings = settings_for(unique, max_forecast_age_s=60.0)
    await bus.publish(NODE_CHANGED.at(name=f"n-{unique}"), node(f"n-{unique}", 8.0))
    async with running(bus, settings, f"a-{unique}") as planner:
        old = datetime.now(UTC) - timedelta(hours=1)
        await bus.publish(
            FORECAST.at(namespace=unique, workload="web"), forecast(unique, 500.0, issued=old)
        )
        status = collectors["status"].items
        await eventually(
            lambda: any(
                isinstance(s, PlannerStatus)
                and s.planner == f"a-{unique}"
                and s.mode == "degraded"
                and any("web" in reason for reason in s.reasons)
                for s in status
            )
        )
        assert planner.mode == "degraded"
        plans = collectors["plans"].items
        await eventually(lambda: any(isinstance(p, PlanDecided) for p in plans))
        latest = [p for p in plans if isinstance(p, PlanDecided)][-1]
        by_name = {t.target.name: t for t in latest.targets}
        assert by_name["web"].desired == 1  # held at its floor: nothing known to size it
        assert by_name["train"].desired == 0  # no growth while serving's demand is unknown
        assert "not growing" in by_name["train"].reason or "gang" in by_name["train"].reason

        # A fresh forecast ends the degraded mode.
        await bus.publish(FORECAST.at(namespace=unique, workload="web"), forecast(unique, 300.0))
        await eventually(lambda: planner.mode == "normal")


async def test_silent_watcher_is_announced_and_ends_with_the_next_event(
    bus: Bus, unique: str, collectors: dict[str, Collector]
) -> None:
    settings = settings_for(unique, cluster_silence_seconds=1.0)
    async with running(bus, settings, f"a-{unique}") as planner:
        await bus.publish(FORECAST.at(namespace=unique, workload="web"), forecast(unique, 300.0))
        await eventually(lambda: any("cluster view stale" in r for r in planner.reasons))
        assert planner.mode == "degraded"
        await bus.publish(NODE_CHANGED.at(name=f"n-{unique}"), node(f"n-{unique}", 8.0))
        await eventually(lambda: planner.mode == "normal")
