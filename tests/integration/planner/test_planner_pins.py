"""An operator's pin holds through planning cycles, is reported in the plan, and hands the
target back on release; a paused workload is left alone. Real NATS, the real planner."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import UTC, datetime

import pytest

from tests.integration.planner.test_planner_service import (
    Collector,
    commands_for,
    eventually,
    forecast,
    node,
    running,
    settings_for,
)
from tideshift.events import (
    FORECAST,
    NODE_CHANGED,
    PLAN_DECIDED,
    SCALE_COMMAND,
    SCALE_RESULT,
    PlanDecided,
    ScaleResult,
    WorkloadRef,
)
from tideshift.services.common.bus import Bus
from tideshift.services.executor.scale_cli import pin, release


@pytest.fixture
async def seen(bus: Bus, unique: str) -> AsyncIterator[dict[str, Collector]]:
    found = {"commands": Collector(), "plans": Collector()}
    await found["commands"].start(bus, SCALE_COMMAND.filter(namespace=unique), f"c-{unique}")
    await found["plans"].start(bus, PLAN_DECIDED.filter(), f"p-{unique}")
    yield found
    for collector in found.values():
        await collector.stop()


def decisions_for(plans: Collector, name: str) -> list[tuple[int, str]]:
    return [
        (t.desired, t.reason)
        for p in plans.items
        if isinstance(p, PlanDecided)
        for t in p.targets
        if t.target.name == name
    ]


async def test_a_pin_holds_three_cycles_and_release_hands_the_target_back(
    bus: Bus, unique: str, seen: dict[str, Collector]
) -> None:
    settings = settings_for(unique, pins_bucket=f"pins_{unique}")
    web = WorkloadRef(unique, "Deployment", "web")
    commands, plans = seen["commands"], seen["plans"]
    async with running(bus, settings, f"a-{unique}") as planner:
        await bus.publish(NODE_CHANGED.at(name=f"n-{unique}"), node(f"n-{unique}", 16.0))
        await bus.publish(FORECAST.at(namespace=unique, workload="web"), forecast(unique, 500.0))
        await eventually(lambda: [c.desired for c in commands_for(commands, "web")][-1:] == [5])

        await pin(bus, web, 2, until=None, reason="load test", bucket=settings.pins_bucket)
        # The operator's command, as an executor would confirm it.
        await bus.publish_durable(
            SCALE_RESULT.at(namespace=unique, kind=web.kind, name="web"),
            ScaleResult(
                target=web,
                idempotency_key="manual-1",
                outcome="applied",
                previous=5,
                current=2,
                desired=2,
                executed_at=datetime.now(UTC),
            ),
        )
        await eventually(lambda: any("pinned at 2" in r for _, r in decisions_for(plans, "web")))
        sent_before = len(commands_for(commands, "web"))
        pinned_plans = planner.plans
        await eventually(lambda: planner.plans >= pinned_plans + 3)  # three more cycles
        held = decisions_for(plans, "web")[-3:]
        assert all(desired == 2 and "pinned at 2 by the operator" in r for desired, r in held)
        assert len(commands_for(commands, "web")) == sent_before  # nothing reverted it

        await release(bus, web, bucket=settings.pins_bucket)
        await eventually(lambda: len(commands_for(commands, "web")) == sent_before + 1)
        assert commands_for(commands, "web")[-1].desired == 5
        assert "forecast" in commands_for(commands, "web")[-1].reason
