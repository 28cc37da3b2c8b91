"""/readyz reasons: starting, NATS down, and each service's own checks (a watch that is down)."""

from __future__ import annotations

from dataclasses import dataclass

from tideshift.services.common.runtime import ServiceContext
from tideshift.services.common.settings import ServiceSettings


@dataclass
class _Connection:
    connected: bool


def test_not_ready_reasons_name_every_cause() -> None:
    connection = _Connection(connected=True)
    down: list[str] = ["pods"]
    context = ServiceContext(
        name="watcher",
        settings=ServiceSettings(),
        bus=connection,  # type: ignore[arg-type]  # only `connected` is read
        instance="w1",
    )
    context.readiness_checks.append(lambda: [f"not watching {name}" for name in down])
    assert context.not_ready_reasons() == ["starting", "not watching pods"]
    context.ready.set()
    connection.connected = False
    assert context.not_ready_reasons() == ["NATS disconnected", "not watching pods"]
    connection.connected = True
    down.clear()
    assert context.not_ready_reasons() == []
