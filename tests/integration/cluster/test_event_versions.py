"""A rolling upgrade's mixed versions on a real nats-server: the executor (this build, which
reads `scale.command.v1`) is given what a newer producer might send, a `scale.command.v2` and
a v1 command carrying a field this build does not know. Each is dead-lettered with a reason
naming what was not understood, terminated (not redelivered), and the executor goes on to
apply the next command it does read. The contract's versioning rules this follows are in
docs/operations/reliability-table.md."""

from __future__ import annotations

import asyncio
import json
from datetime import UTC, datetime
from typing import Any

from tests.fixtures.support import eventually
from tests.integration.cluster.tasks import collect, running
from tideshift import events
from tideshift.events import DEAD_LETTER, SCALE_COMMAND, SCALE_RESULT, ScaleCommand, WorkloadRef
from tideshift.services.cluster.port import Node, Resources
from tideshift.services.cluster.sim import SimCluster, SimClusterPort, SimWorkload
from tideshift.services.common.bus import DEAD_LETTER_STREAM, SCALE_STREAM, Bus
from tideshift.services.executor.executor import Executor, RecordStore
from tideshift.services.executor.service import consume

WAIT = 20.0
T0 = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)


def command(ref: WorkloadRef, desired: int, key: str) -> ScaleCommand:
    return ScaleCommand(
        target=ref, desired=desired, reason="t", plan_id="p", issued_at=T0, idempotency_key=key
    )


def newer(raw: bytes, *, version: int | None = None, extra: dict[str, Any] | None = None) -> bytes:
    """What a newer producer might send: the same event under another schema version, or with
    a field this build does not know."""
    body = json.loads(raw)
    if version is not None:
        body["type"] = body["type"].replace(".v1", f".v{version}")
    body["data"].update(extra or {})
    return json.dumps(body).encode()


async def test_an_unknown_event_version_is_dead_lettered_with_a_reason_and_the_consumer_goes_on(
    bus: Bus, unique: str
) -> None:
    namespace = f"ver-{unique}"
    ref = WorkloadRef(namespace, "Deployment.apps", "web")
    cluster = SimCluster(now=0.0)
    cluster.add_node(Node("n1", Resources(cpu=16, memory=64 * 2**30)))
    cluster.add_workload(
        SimWorkload(
            ref=ref, kind="Deployment", role="serving", pod_requests=Resources(cpu=0.1), replicas=1
        )
    )
    executor = Executor(SimClusterPort(cluster), RecordStore(await bus.kv(f"ver_{unique}")))
    durable = f"ver-{unique}"
    subject = SCALE_COMMAND.at(namespace=namespace, kind=ref.kind, name=ref.name)
    results: list[Any] = []
    sent = {
        "v2": newer(events.encode(command(ref, 7, "v2"), source="newer"), version=2),
        "v1+field": newer(
            events.encode(command(ref, 8, "extra"), source="newer"), extra={"priority": "high"}
        ),
    }
    async with running(
        collect(bus.subscribe(SCALE_RESULT.filter(namespace=namespace), consumer="t"), results),
        consume(executor, bus, durable=durable, subject=SCALE_COMMAND.filter(namespace=namespace)),
    ):
        await asyncio.sleep(0.05)
        for key, raw in sent.items():
            await bus.js.publish(subject.value, raw, headers={"Nats-Msg-Id": f"{unique}-{key}"})
        await bus.publish_durable(subject, command(ref, 3, "ok"))
        await eventually(lambda: len(results) >= 1, WAIT, message="the readable command's result")
    assert [(r.idempotency_key, r.outcome, r.current) for r in results] == [("ok", "applied", 3)]
    assert cluster.workload(ref).replicas == 3

    letters = bus.consume(
        DEAD_LETTER.at(consumer=durable), stream=DEAD_LETTER_STREAM, durable=f"read-{unique}"
    )
    reasons = []
    for _ in sent:
        delivery = await asyncio.wait_for(anext(letters), WAIT)
        reasons.append(delivery.event.data.reason)
        assert delivery.event.data.original_subject == subject.value
        await delivery.ack()
    await letters.aclose()  # type: ignore[attr-defined]
    assert "unsupported schema version v2 of io.tideshift.scale.command" in reasons[0]
    assert "this build reads io.tideshift.scale.command.v1" in reasons[0]
    assert "data.priority" in reasons[1] and "Extra inputs" in reasons[1]
    info = await bus.js.consumer_info(SCALE_STREAM.name, durable)
    assert (info.num_ack_pending, info.num_pending) == (0, 0), "nothing left to redeliver"
