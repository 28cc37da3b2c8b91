"""Read back what a JetStream stream holds under a subject filter: exactly as many events as
the stream reports, so a check never waits for a quiet period to decide it has seen them all."""

from __future__ import annotations

import asyncio
import uuid
from typing import TypeVar

from tideshift.events import EventData
from tideshift.events.subjects import BoundSubject
from tideshift.services.common.bus import Bus, StreamSpec

T = TypeVar("T", bound=EventData)


async def stored_count(bus: Bus, subject: BoundSubject[T], *, stream: StreamSpec) -> int:
    """Messages `stream` holds on every subject matching the (wildcard) `subject`."""
    info = await bus.js.stream_info(stream.name, subjects_filter=subject.value)
    return sum((info.state.subjects or {}).values())


async def read_stored(
    bus: Bus, subject: BoundSubject[T], *, stream: StreamSpec, timeout: float = 30.0
) -> list[T]:
    """Every event the stream holds under `subject`, oldest first (a limits stream: reading
    removes nothing)."""
    expected = await stored_count(bus, subject, stream=stream)
    durable = f"chaos-read-{uuid.uuid4().hex[:8]}"
    deliveries = bus.consume(subject, stream=stream, durable=durable, max_ack_pending=1024)
    events: list[T] = []
    try:
        async with asyncio.timeout(timeout):
            while len(events) < expected:
                delivery = await anext(deliveries)
                events.append(delivery.event.data)
                await delivery.ack()
    finally:
        await deliveries.aclose()
        await bus.delete_consumer(stream, durable)
    return events
