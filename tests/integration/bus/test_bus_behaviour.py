"""The bus's behaviour, the same for both implementations of the port: the NATS `Bus` on a
real nats-server and the in-memory `MemoryBus` on virtual time. What only a real server does
(MQTT, clusters, permissions, reconnection, listing consumers) stays in test_bus_nats.py and
its neighbours."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import TypeVar

import pytest

from tests.fixtures.support import eventually, pod_changed, scale_command, started
from tideshift import events
from tideshift.services.common.bus import SCALE_STREAM, Bus, KVConflict, RequestFailed
from tideshift.services.common.bus.memory import MemoryBroker
from tideshift.services.common.bus.port import BusPort
from tideshift.services.common.clock import ManualClock

T = TypeVar("T")
WAIT = 10.0


@dataclass
class Harness:
    """Two connections to one bus, and how the test lets `seconds` of bus time pass."""

    bus: BusPort
    other: BusPort
    elapse: Callable[[float], Awaitable[None]]
    kind: str


@pytest.fixture(params=["nats", "memory"])
async def harness(request: pytest.FixtureRequest) -> AsyncIterator[Harness]:
    if request.param == "memory":
        clock = ManualClock()
        broker = MemoryBroker(clock)
        yield Harness(broker.connect("a"), broker.connect("b"), clock.advance, "memory")
        return
    server = request.getfixturevalue("nats_server")
    first = await Bus.connect(server.url, name=f"test-{uuid.uuid4().hex[:8]}")
    second = await Bus.connect(server.url, name=f"test-{uuid.uuid4().hex[:8]}")
    await first.ensure_streams()
    try:
        yield Harness(first, second, asyncio.sleep, "nats")
    finally:
        await first.close()
        await second.close()


async def listening(h: Harness) -> None:
    """Let the subscriptions register (a round trip to a real server)."""
    for _ in range(3):
        await asyncio.sleep(0)
    await h.bus.flush()
    await h.other.flush()


async def test_core_publish_reaches_every_subscriber_and_one_per_queue_group(
    harness: Harness, unique: str
) -> None:
    subject = events.POD_CHANGED.filter(namespace=unique)
    plain = harness.other.subscribe(subject, consumer="plain")
    grouped = [harness.other.subscribe(subject, consumer="g", queue="group") for _ in range(2)]
    async with started(plain) as everything, started(grouped[0]) as one, started(grouped[1]) as two:
        await listening(harness)
        for index in range(4):
            await harness.bus.publish(
                events.POD_CHANGED.at(namespace=unique, name=f"p{index}"),
                pod_changed(unique, f"p{index}"),
            )
        names = [(await asyncio.wait_for(everything.get(), WAIT)).data.name for _ in range(4)]
        assert names == ["p0", "p1", "p2", "p3"]
        await eventually(lambda: one.qsize() + two.qsize() >= 4)
        await listening(harness)  # a copy to the other member too would have arrived by now
        assert one.qsize() + two.qsize() == 4  # each went to one member of the group


async def test_publish_refuses_the_wrong_transport_model_and_wildcards(
    harness: Harness, unique: str
) -> None:
    command = scale_command(unique)
    with pytest.raises(ValueError, match="publish_durable"):
        await harness.bus.publish(
            events.SCALE_COMMAND.at(namespace=unique, kind="Deployment", name="web"), command
        )
    with pytest.raises(ValueError, match="core NATS"):
        await harness.bus.publish_durable(
            events.POD_CHANGED.at(namespace=unique, name="p"), pod_changed(unique)
        )
    with pytest.raises(ValueError, match="wildcard"):
        await harness.bus.publish(events.POD_CHANGED.filter(namespace=unique), pod_changed(unique))
    with pytest.raises(TypeError, match="carries PodChanged"):
        await harness.bus.publish(events.POD_CHANGED.at(namespace=unique, name="p"), command)  # type: ignore[arg-type]


async def test_durable_publish_is_stored_once_per_id_and_seen_by_core_subscribers(
    harness: Harness, unique: str
) -> None:
    subject = events.SCALE_COMMAND.at(namespace=unique, kind="Deployment", name="web")
    watching = harness.other.subscribe(events.SCALE_COMMAND.filter(namespace=unique), consumer="w")
    async with started(watching) as seen:
        await listening(harness)
        first = await harness.bus.publish_durable(subject, scale_command(unique), msg_id=unique)
        again = await harness.bus.publish_durable(subject, scale_command(unique), msg_id=unique)
        assert first == again
        # Stored once; core subscribers see every publish (the stream de-duplicates, the
        # subject does not).
        for _ in range(2):
            assert (await asyncio.wait_for(seen.get(), WAIT)).data.idempotency_key == "k1"
    assert await harness.bus.queued(subject, stream=SCALE_STREAM) == 1


async def test_a_durable_consumer_redelivers_what_was_handed_back_and_stops_at_max_deliver(
    harness: Harness, unique: str
) -> None:
    subject = events.SCALE_COMMAND.filter(namespace=unique)
    durable = f"d-{unique}"
    for key in ("a", "b"):
        await harness.bus.publish_durable(
            events.SCALE_COMMAND.at(namespace=unique, kind="Deployment", name="web"),
            scale_command(unique, key=key),
            msg_id=f"{unique}-{key}",
        )
    deliveries = harness.other.consume(
        subject, stream=SCALE_STREAM, durable=durable, ack_wait_seconds=1.0, max_deliver=2
    )
    async with started(deliveries) as got:
        a = await asyncio.wait_for(got.get(), WAIT)
        b = await asyncio.wait_for(got.get(), WAIT)
        assert (a.event.data.idempotency_key, b.event.data.idempotency_key) == ("a", "b")
        await a.ack()
        await b.nak()  # handed back at once
        again = await asyncio.wait_for(got.get(), WAIT)
        assert (again.event.data.idempotency_key, again.num_delivered) == ("b", 2)
        # Not acked within ack_wait, and delivered max_deliver times: never again. A message
        # published after its redelivery would have been due is the next one delivered.
        await harness.elapse(1.5)
        await harness.bus.publish_durable(
            events.SCALE_COMMAND.at(namespace=unique, kind="Deployment", name="web"),
            scale_command(unique, key="c"),
            msg_id=f"{unique}-c",
        )
        after = await asyncio.wait_for(got.get(), WAIT)
        assert (after.event.data.idempotency_key, after.num_delivered) == ("c", 1)
        await after.ack()


async def test_a_delivery_not_acked_in_time_comes_back(harness: Harness, unique: str) -> None:
    await harness.bus.publish_durable(
        events.SCALE_COMMAND.at(namespace=unique, kind="Deployment", name="web"),
        scale_command(unique),
    )
    deliveries = harness.bus.consume(
        events.SCALE_COMMAND.filter(namespace=unique),
        stream=SCALE_STREAM,
        durable=f"d-{unique}",
        ack_wait_seconds=1.0,
    )
    async with started(deliveries) as got:
        first = await asyncio.wait_for(got.get(), WAIT)
        assert first.num_delivered == 1
        await harness.elapse(1.2)
        second = await asyncio.wait_for(got.get(), WAIT)
        assert (second.event.data, second.num_delivered) == (first.event.data, 2)
        await second.ack()


async def test_invalid_messages_are_dead_lettered_and_the_consumer_goes_on(
    harness: Harness, unique: str
) -> None:
    letters = harness.other.subscribe(events.DEAD_LETTER.filter(), consumer="letters")
    subject = events.POD_CHANGED.filter(namespace=unique)
    good = harness.bus.subscribe(subject, consumer=f"c-{unique}", buffer=8)
    async with started(letters) as dead, started(good) as received:
        await listening(harness)
        raw = events.POD_CHANGED.at(namespace=unique, name="bad").value
        if isinstance(harness.bus, Bus):
            await harness.bus.connection.publish(raw, b"{not json")
        else:
            harness.bus.broker.fan_out(raw, b"{not json")  # type: ignore[attr-defined]
        await harness.bus.publish(
            events.POD_CHANGED.at(namespace=unique, name="ok"), pod_changed(unique, "ok")
        )
        assert (await asyncio.wait_for(received.get(), WAIT)).data.name == "ok"
        while True:
            letter = (await asyncio.wait_for(dead.get(), WAIT)).data
            if letter.consumer == f"c-{unique}":
                break
        assert letter.original_subject == raw


async def test_kv_revisions_compare_and_set_and_listing(harness: Harness, unique: str) -> None:
    kv = await harness.bus.kv(f"b{unique}")
    value = scale_command(unique)
    assert await kv.get_revision("k", events.ScaleCommand) == (None, None)
    first = await kv.update("k", value, revision=None)
    with pytest.raises(KVConflict):
        await kv.update("k", value, revision=None)
    second = await kv.update("k", value, revision=first)
    assert second > first
    with pytest.raises(KVConflict):
        await kv.update("k", value, revision=first)
    assert await kv.get_revision("k", events.ScaleCommand) == (value, second)
    await kv.put("other", value)
    assert sorted(await kv.keys()) == ["k", "other"]
    await kv.delete("other")
    assert await kv.keys() == ["k"]
    assert await kv.get("other", events.ScaleCommand) is None


async def test_a_lease_is_exclusive_until_it_expires(harness: Harness, unique: str) -> None:
    one = await harness.bus.lease(f"l{unique}", holder="one", ttl_seconds=1.0)
    two = await harness.other.lease(f"l{unique}", holder="two", ttl_seconds=1.0)
    assert await one.try_acquire()
    assert not await two.try_acquire()
    assert await one.try_acquire()  # renewed
    await harness.elapse(1.2)
    assert await two.try_acquire()
    assert not await one.try_acquire()
    await two.release()
    assert await one.try_acquire()
    await one.release()


async def test_request_reply_and_a_failing_handler(harness: Harness, unique: str) -> None:
    async def echo(payload: bytes) -> bytes:
        if payload == b"boom":
            raise RuntimeError("no")
        return payload.upper()

    stop = await harness.other.serve(f"rpc.{unique}", echo)
    await listening(harness)
    assert await harness.bus.request(f"rpc.{unique}", b"hi") == b"HI"
    assert await harness.bus.request(f"rpc.{unique}", b"boom") == b"error: no"
    await stop()
    await listening(harness)
    with pytest.raises(RequestFailed):
        await harness.bus.request(f"rpc.{unique}", b"hi", timeout=0.5)


async def test_objects_round_trip(harness: Harness, unique: str) -> None:
    await harness.bus.put_object(f"o{unique}", "x", b"\x00data")
    assert await harness.other.get_object(f"o{unique}", "x") == b"\x00data"
    assert await harness.other.get_object(f"o{unique}", "missing") is None
