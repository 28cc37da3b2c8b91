"""A core-NATS subscriber that falls behind loses messages (nats-py's slow consumer): the bus
counts each loss under the subscriber's name and calls its `on_drop`, so a service can repair
what it missed instead of trusting a view with holes. Against a real nats-server."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime

from prometheus_client import REGISTRY

from tideshift import events
from tideshift.services.common.bus import Bus

WAIT = 10.0
BUFFER = 4
SENT = 200
# All but the first message and what both buffers hold (+1 in flight) are lost.
LOST_AT_LEAST = SENT - 1 - 2 * BUFFER - 1


def backlog(consumer: str) -> float | None:
    return REGISTRY.get_sample_value("tideshift_bus_backlog", {"consumer": consumer})


def dropped(consumer: str) -> float:
    value = REGISTRY.get_sample_value("tideshift_bus_dropped_total", {"consumer": consumer})
    return value or 0.0


async def test_a_subscriber_that_falls_behind_is_told_and_counted(bus: Bus, unique: str) -> None:
    drops: list[None] = []
    all_lost = asyncio.Event()

    def on_drop() -> None:
        drops.append(None)
        if len(drops) >= LOST_AT_LEAST:
            all_lost.set()

    subscription = bus.subscribe(
        events.POD_CHANGED.filter(namespace=unique),
        consumer=unique,
        buffer=BUFFER,
        on_drop=on_drop,
    )
    # The first event is taken; the subscriber then reads nothing more, like a loop busy
    # with a long plan: its buffers fill and the server's further messages are dropped.
    first = asyncio.ensure_future(anext(subscription))
    await bus.flush()
    stamp = datetime(2026, 1, 1, tzinfo=UTC)
    for index in range(SENT):
        pod = events.PodChanged(
            change="added", namespace=unique, name=f"p{index}", phase="Running", observed_at=stamp
        )
        await bus.publish(events.POD_CHANGED.at(namespace=unique, name=f"p{index}"), pod)
    await bus.flush()
    envelope = await asyncio.wait_for(first, WAIT)
    assert envelope.data.name == "p0"
    # The server may still be delivering (a flush says it has read our publishes, not that
    # the subscriber has been sent them): wait until all but what both buffers hold is lost.
    await asyncio.wait_for(all_lost.wait(), WAIT)
    # What it kept waits in its buffers, and the backlog gauge says so at scrape time.
    assert 0 < (backlog(unique) or 0) <= 2 * BUFFER + 1
    await subscription.aclose()
    # Each loss is one call and one count; what was kept is at most both buffers.
    assert dropped(unique) == len(drops)
    # Unsubscribed: the bus forgets the subscriber (no callback kept alive by the registry).
    assert len(bus.slow_consumers) == 0
    assert backlog(unique) is None
