"""Dead letters cannot amplify (issue 25): the reason is one line of at most 1 KB whatever the
offending value, and the dead-letter stream keeps to its byte and message limits, dropping the
oldest and counting the drops. Against a real nats-server."""

from __future__ import annotations

import asyncio
import dataclasses
import json
from collections.abc import AsyncIterator
from typing import Any

import pytest
from prometheus_client import REGISTRY

from tests.fixtures.support import eventually
from tideshift import events
from tideshift.services.common.bus import DEAD_LETTER_STREAM, Bus
from tideshift.services.common.bus.client import DEAD_LETTER_REASON_BYTES, one_line
from tideshift.services.common.embedded_nats import EmbeddedNats

WAIT = 10.0


def hostile(event_type: str) -> bytes:
    body = {"specversion": "1.0", "id": "x", "source": "evil", "type": event_type, "data": {}}
    return json.dumps(body).encode()


async def letters_stored(bus: Bus, at_least: int) -> int:
    """The dead-letter stream's message count once it reaches `at_least`."""

    async def stored() -> int | None:
        count = (await bus.js.stream_info(DEAD_LETTER_STREAM.name)).state.messages
        return count if count >= at_least else None

    return await eventually(stored, WAIT, message=f"fewer than {at_least} letters stored")


@pytest.fixture
async def small_stream_bus() -> AsyncIterator[Bus]:
    """A server of its own: the dead-letter stream here holds 3 letters, so the shared one
    keeps its real limits."""
    with EmbeddedNats() as server:
        bus = await Bus.connect(server.url, name="dl-bounds", max_message_bytes=2 * 1024 * 1024)
        await bus.ensure_streams((dataclasses.replace(DEAD_LETTER_STREAM, max_msgs=3),))
        try:
            yield bus
        finally:
            await bus.close()


def test_a_reason_is_one_line_of_at_most_the_limit() -> None:
    reason = one_line("unknown event type 'a\nb" + "é" * 600_000, DEAD_LETTER_REASON_BYTES)
    assert "\n" not in reason
    assert len(reason.encode()) <= DEAD_LETTER_REASON_BYTES
    assert reason.startswith("unknown event type 'a b")
    flat_bytes = len(b"unknown event type 'a b") + 2 * 600_000
    assert reason.endswith(f"... ({flat_bytes} bytes)")
    assert one_line("short", DEAD_LETTER_REASON_BYTES) == "short"


async def test_a_900_kb_type_gives_a_small_dead_letter(small_stream_bus: Bus) -> None:
    bus, consumer = small_stream_bus, "bounds"
    target = events.POD_CHANGED.filter(namespace="ns")
    subscription = bus.subscribe(target, consumer=consumer)
    pump = asyncio.create_task(anext(subscription))
    await asyncio.sleep(0)
    await bus.flush()
    await bus.connection.publish("tideshift.v1.cluster.pod.ns.a", hostile("t" * 900_000))
    assert await letters_stored(bus, 1) == 1
    pump.cancel()
    letters = bus.consume(
        events.DEAD_LETTER.at(consumer=consumer), stream=DEAD_LETTER_STREAM, durable="read"
    )
    delivery = await asyncio.wait_for(anext(letters), WAIT)
    await delivery.ack()
    await letters.aclose()
    letter = delivery.event.data
    assert letter.reason.startswith("unknown event type 'tttt")
    assert len(letter.reason.encode()) <= DEAD_LETTER_REASON_BYTES
    assert letter.payload_bytes > 900_000
    stored = (await bus.js.stream_info(DEAD_LETTER_STREAM.name)).state.bytes
    assert stored < 4 * 1024, f"the dead letter takes {stored} bytes"


async def test_a_flood_keeps_the_stream_to_its_limit_and_counts_the_discards(
    small_stream_bus: Bus,
) -> None:
    bus, consumer = small_stream_bus, "flood"
    subscription = bus.subscribe(events.POD_CHANGED.filter(namespace="ns"), consumer=consumer)
    pump = asyncio.create_task(anext(subscription))
    await asyncio.sleep(0)
    await bus.flush()
    for n in range(10):
        await bus.connection.publish("tideshift.v1.cluster.pod.ns.a", hostile(f"bad-{n}"))

    async def all_ten() -> Any:
        info = await bus.js.stream_info(DEAD_LETTER_STREAM.name)
        return info if info.state.last_seq >= 10 else None

    info = await eventually(all_ten, WAIT, message="fewer than 10 letters written")
    pump.cancel()
    assert (info.state.last_seq, info.state.messages) == (10, 3), "the oldest 7 were dropped"
    discarded = REGISTRY.get_sample_value(
        "tideshift_bus_deadletters_discarded_total", {"consumer": consumer}
    )
    assert discarded == 7, "each letter that displaced an older one is counted"


def test_the_dead_letter_stream_has_byte_and_message_limits() -> None:
    config = DEAD_LETTER_STREAM.config()
    assert config.max_bytes is not None and 0 < config.max_bytes <= 256 * 1024 * 1024
    assert config.max_msgs is not None and config.max_msgs > 0
    assert config.discard is not None and config.discard.value == "old"
