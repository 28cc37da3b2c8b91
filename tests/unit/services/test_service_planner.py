"""The planner service on the in-memory bus and virtual time: a node and a forecast (from the
stand-in predictor) become a scale command with its reason; ticks plan on clock time; a
command nothing confirms is sent again after `resend_seconds` of clock time."""

from __future__ import annotations

import functools
from typing import Any

import pytest

from tests.fixtures.support import (
    StandInPredictor,
    collect,
    eventually,
    forecast,
    node_changed,
    running,
    serving_web,
)
from tideshift import events
from tideshift.services.common.bus.memory import MemoryBroker, MemoryBus
from tideshift.services.common.clock import ManualClock, utc_now
from tideshift.services.planner import service as planner_service
from tideshift.services.planner.settings import PlannerSettings

NS = "shop"


def settings(**overrides: Any) -> PlannerSettings:
    fields: dict[str, Any] = {
        "serving": [serving_web(NS)],
        "tick_seconds": 15.0,
        "health_port": -1,
        "rise_history_bucket": "",
    }
    return PlannerSettings(**(fields | overrides))


def web_commands(items: list[Any]) -> list[events.ScaleCommand]:
    return [c for c in items if isinstance(c, events.ScaleCommand) and c.target.name == "web"]


def desired(items: list[Any]) -> int | None:
    """What the latest command for web asks."""
    sent = web_commands(items)
    return sent[-1].desired if sent else None


@pytest.fixture
async def commands(bus: MemoryBus) -> Any:
    items: list[Any] = []
    task = await collect(bus, events.SCALE_COMMAND.filter(namespace=NS), items)
    yield items
    task.cancel()


async def test_a_forecast_becomes_a_command_and_unconfirmed_ones_are_sent_again(
    broker: MemoryBroker, bus: MemoryBus, clock: ManualClock, commands: list[Any]
) -> None:
    chosen = settings()
    body = functools.partial(planner_service.serve, chosen, clock=clock)
    async with running(broker, "planner", chosen, body) as context:
        await bus.publish(events.NODE_CHANGED.at(name="n1"), node_changed("n1"))
        await StandInPredictor(bus, clock).forecast(NS, "web", [500.0] * 10)
        # The node alone may plan first (no forecast: web held at its minimum).
        await eventually(lambda: desired(commands) == 5, message="web not sized to 5")
        first = web_commands(commands)[-1]  # 500 req/s at 100 a replica
        assert "forecast" in first.reason
        assert context.not_ready_reasons() == []

        # Ticks on clock time: more plans, and no command while nothing changed.
        sent = len(web_commands(commands))
        planner = context.readiness_checks[0].__self__  # type: ignore[attr-defined]
        plans = planner.plans
        await clock.advance(chosen.tick_seconds)
        await eventually(lambda: planner.plans > plans)
        assert len(web_commands(commands)) == sent

        # Nothing confirmed the command (no executor): re-sent once resend_seconds passed.
        # The forecast is refreshed so it stays fresh across the jump.
        await clock.advance(chosen.resend_seconds)
        await StandInPredictor(bus, clock).forecast(NS, "web", [500.0] * 10)
        await eventually(lambda: len(web_commands(commands)) > sent, message="not re-sent")
        again = web_commands(commands)[-1]
        assert again.desired == 5 and again.idempotency_key != first.idempotency_key


async def test_a_confirmed_command_is_not_sent_again(
    broker: MemoryBroker, bus: MemoryBus, clock: ManualClock, commands: list[Any]
) -> None:
    chosen = settings()
    body = functools.partial(planner_service.serve, chosen, clock=clock)
    async with running(broker, "planner", chosen, body) as context:
        planner = context.readiness_checks[0].__self__  # type: ignore[attr-defined]
        await bus.publish(events.NODE_CHANGED.at(name="n1"), node_changed("n1"))
        await StandInPredictor(bus, clock).forecast(NS, "web", [300.0] * 10)
        await eventually(lambda: desired(commands) == 3)
        command = web_commands(commands)[-1]
        result = events.ScaleResult(
            target=command.target,
            idempotency_key=command.idempotency_key,
            outcome="applied",
            previous=1,
            current=command.desired,
            desired=command.desired,
            executed_at=command.issued_at,
            executor="test",
        )
        subject = events.SCALE_RESULT.at(namespace=NS, kind="Deployment", name="web")
        await bus.publish_durable(subject, result, msg_id=f"result-{command.idempotency_key}")
        await eventually(lambda: planner.state.confirmed.get(command.target) == command.desired)
        sent = len(web_commands(commands))
        await clock.advance(chosen.resend_seconds + chosen.tick_seconds)
        await StandInPredictor(bus, clock).forecast(NS, "web", [300.0] * 10)
        plans = planner.plans
        await eventually(lambda: planner.plans > plans)
        assert len(web_commands(commands)) == sent


async def test_an_untrusted_forecast_is_planned_around_and_the_status_says_why(
    broker: MemoryBroker, bus: MemoryBus, clock: ManualClock, commands: list[Any]
) -> None:
    chosen = settings()
    statuses: list[Any] = []
    watching = await collect(bus, events.PLANNER_STATUS.filter(), statuses)
    body = functools.partial(planner_service.serve, chosen, clock=clock)
    predictor = StandInPredictor(bus, clock)
    try:
        async with running(broker, "planner", chosen, body):
            await bus.publish(events.NODE_CHANGED.at(name="n1"), node_changed("n1"))
            await predictor.forecast(NS, "web", [500.0] * 10)
            await eventually(lambda: desired(commands) == 5, message="web not sized to 5")
            # The predictor stops trusting web's forecasts: a higher one no longer sizes it.
            why = "q0.95 held for 40% of the last 120 steps"
            higher = forecast(NS, "web", [900.0] * 10, issued_at=utc_now(clock))
            await bus.publish(
                events.FORECAST.at(namespace=NS, workload="web"),
                higher.model_copy(update={"untrusted_reason": why}),
            )
            await eventually(
                lambda: any(why in reason for s in statuses for reason in s.reasons),
                message="the planner's status never said the forecast is untrusted",
            )
            assert statuses[-1].mode == "degraded"
            assert desired(commands) == 5  # held where it was, not raised to 9
    finally:
        watching.cancel()
