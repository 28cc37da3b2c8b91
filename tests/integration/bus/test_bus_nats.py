"""The bus against a real nats-server: typed pub/sub, JetStream, leases, dead letters, MQTT
(what the in-memory bus does alike is tested on both in test_bus_behaviour.py)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from datetime import timedelta
from typing import TypeVar

import aiomqtt
import pytest
from prometheus_client import REGISTRY

from tests.fixtures.support import NOW, pod_changed, started
from tideshift import events
from tideshift.services.common.bus import (
    DEAD_LETTER_STREAM,
    SCALE_STREAM,
    STREAMS,
    TRAINING_TASK_STREAM,
    Bus,
    RequestFailed,
)
from tideshift.services.common.embedded_nats import EmbeddedNats

T = TypeVar("T")
WAIT = 10.0


def command(namespace: str, desired: int = 3, key: str = "k1") -> events.ScaleCommand:
    return events.ScaleCommand(
        target=events.WorkloadRef(kind="Deployment", namespace=namespace, name="web.v1"),
        desired=desired,
        reason="test",
        plan_id="p1",
        issued_at=NOW,
        idempotency_key=key,
    )


async def first(iterator: AsyncIterator[T], timeout: float = WAIT) -> T:
    return await asyncio.wait_for(anext(iterator), timeout)


async def subscribed(bus: Bus) -> None:
    """A flush round trip guarantees the server has registered earlier subscriptions."""
    await bus.flush()


async def test_typed_publish_and_subscribe(bus: Bus, unique: str) -> None:
    subscription = bus.subscribe(events.POD_CHANGED.filter(namespace=unique), consumer="t")
    async with started(subscription) as received:
        await asyncio.sleep(0)
        await subscribed(bus)
        sent = pod_changed(unique, name="api.v2")
        await bus.publish(events.POD_CHANGED.at(namespace=unique, name="api.v2"), sent)
        envelope = await asyncio.wait_for(received.get(), WAIT)
    assert envelope.data == sent
    assert envelope.subject == f"tideshift.v1.cluster.pod.{unique}.api_2Ev2"
    assert envelope.source.startswith("tideshift/")


def test_streams_capture_exactly_the_durable_subjects() -> None:
    captured = {subject for spec in STREAMS for subject in spec.subjects}
    durable = {s.filter().value for s in events.ALL_SUBJECTS if s.durable}
    assert captured == durable
    assert SCALE_STREAM.subjects == (
        "tideshift.v1.scale.command.*.*.*",
        "tideshift.v1.scale.result.*.*.*",
    )


async def test_two_durable_consumers_share_work(bus: Bus, unique: str) -> None:
    subject = events.SCALE_COMMAND.at(namespace=unique, kind="Deployment", name="web")
    for i in range(6):
        await bus.publish_durable(subject, command(unique, desired=i, key=str(i)))
    spec = events.SCALE_COMMAND.filter(namespace=unique)
    one = bus.consume(spec, stream=SCALE_STREAM, durable=f"shared-{unique}")
    two = bus.consume(spec, stream=SCALE_STREAM, durable=f"shared-{unique}")
    seen: list[int] = []
    for iterator in (one, two, one, two, one, two):
        delivery = await first(iterator)
        seen.append(delivery.event.data.desired)
        await delivery.ack()
    assert sorted(seen) == list(range(6))
    await one.aclose()
    await two.aclose()


async def test_lease_is_exclusive_and_taken_over_after_ttl(bus: Bus, unique: str) -> None:
    alice = await bus.lease(f"planner-{unique}", holder="alice", ttl_seconds=10)
    bob = await bus.lease(f"planner-{unique}", holder="bob", ttl_seconds=10)
    results = await asyncio.gather(alice.try_acquire(NOW), bob.try_acquire(NOW))
    assert sorted(results) == [False, True], "exactly one contender wins a race"
    leader, other = (alice, bob) if results[0] else (bob, alice)
    assert await leader.try_acquire(NOW + timedelta(seconds=5)), "the holder renews"
    assert not await other.try_acquire(NOW + timedelta(seconds=9)), "not before expiry"
    # The leader stops renewing (it died): after its TTL the other takes over.
    assert await other.try_acquire(NOW + timedelta(seconds=16))
    assert not await leader.try_acquire(NOW + timedelta(seconds=17))
    await other.release()
    assert await leader.try_acquire(NOW + timedelta(seconds=18)), "a released lease is free"


BAD_INPUTS = {
    "not_json": b"definitely not json",
    "not_cloudevent": b'{"hello": "world"}',
    "unknown_type": events.encode(command("x"), source="t").replace(
        b"io.tideshift.scale.command.v1", b"io.tideshift.scale.command.v7"
    ),
    "unexpected_type": events.encode(command("x"), source="t"),
    "invalid": events.encode(pod_changed("x"), source="t").replace(b'"Running"', b'"Sleeping"'),
    "too_large": b"{" + b" " * 4096 + b"}",
}


async def test_bad_messages_are_dead_lettered_and_the_subscriber_keeps_going(
    nats_server: EmbeddedNats, unique: str
) -> None:
    small = await Bus.connect(nats_server.url, name="dl-test", max_message_bytes=2048)
    consumer = f"deadletter-test-{unique}"
    try:
        await small.ensure_streams()
        target = events.POD_CHANGED.filter(namespace=unique)
        async with started(small.subscribe(target, consumer=consumer)) as received:
            await asyncio.sleep(0)
            await subscribed(small)
            for raw in BAD_INPUTS.values():
                await small.connection.publish(f"tideshift.v1.cluster.pod.{unique}.bad", raw)
            good = pod_changed(unique)
            await small.publish(events.POD_CHANGED.at(namespace=unique, name="good"), good)
            envelope = await asyncio.wait_for(received.get(), WAIT)
            assert envelope.data == good, "the valid message after the bad ones arrives"
            assert received.empty()
        letters = small.consume(
            events.DEAD_LETTER.at(consumer=consumer),
            stream=DEAD_LETTER_STREAM,
            durable=f"read-{unique}",
        )
        reasons = {}
        for _ in BAD_INPUTS:
            delivery = await first(letters)
            reasons[delivery.event.data.payload[:30]] = delivery.event.data.reason
            assert delivery.event.data.original_subject.endswith(".bad")
            await delivery.ack()
        await letters.aclose()
        assert len(reasons) == len(BAD_INPUTS)
        joined = " | ".join(reasons.values())
        for fragment in (
            "not JSON",
            "missing",
            "schema version v7",
            "was expected",
            "validation",
            "exceeds",
        ):
            assert fragment in joined
        for kind in BAD_INPUTS:
            count = REGISTRY.get_sample_value(
                "tideshift_bus_rejected_total", {"consumer": consumer, "kind": kind}
            )
            assert count == 1, kind
    finally:
        await small.close()


async def test_mqtt_client_receives_events_through_the_listener(
    bus: Bus, nats_server: EmbeddedNats, unique: str
) -> None:
    subject = events.SCALE_COMMAND.at(namespace=unique, kind="Deployment", name="web.v1")
    async with aiomqtt.Client("127.0.0.1", port=nats_server.mqtt_port, identifier=unique) as client:
        await client.subscribe(events.SCALE_COMMAND.filter(namespace=unique).mqtt_topic, qos=1)
        sent = command(unique)
        await bus.publish_durable(subject, sent)
        message = await asyncio.wait_for(anext(aiomqtt_messages(client)), WAIT)
    assert str(message.topic) == subject.mqtt_topic
    assert isinstance(message.payload, bytes)
    assert events.decode(message.payload, events.ScaleCommand).data == sent


async def aiomqtt_messages(client: aiomqtt.Client) -> AsyncIterator[aiomqtt.Message]:
    async for message in client.messages:
        yield message


async def test_kv_helper_round_trips_models(bus: Bus, unique: str) -> None:
    kv = await bus.kv(f"test_{unique}")
    await kv.put("a", pod_changed(unique))
    assert await kv.get("a", events.PodChanged) == pod_changed(unique)
    assert await kv.get("missing", events.PodChanged) is None
    await kv.raw.put("broken", b"{not json")
    items = [key async for key, _ in kv.items(events.PodChanged)]
    assert items == ["a"], "an unreadable value is skipped, not raised"


async def test_objects_queue_depth_and_failed_requests(bus: Bus, unique: str) -> None:
    assert await bus.get_object(f"obj_{unique}", "missing") is None
    await bus.put_object(f"obj_{unique}", "checkpoint", b"\x00\x01" * 1000)
    assert await bus.get_object(f"obj_{unique}", "checkpoint") == b"\x00\x01" * 1000

    task_subject = events.SHARD_TASK.at(job=unique)
    for shard in range(3):
        task = events.ShardTask(job=unique, epoch=0, shard=shard, shards=3, issued_at=NOW)
        await bus.publish_durable(task_subject, task)
    assert await bus.queued(task_subject, stream=TRAINING_TASK_STREAM) == 3
    deliveries = bus.consume(task_subject, stream=TRAINING_TASK_STREAM, durable=f"w-{unique}")
    delivery = await first(deliveries)
    await delivery.ack()
    await deliveries.aclose()
    assert await bus.queued(task_subject, stream=TRAINING_TASK_STREAM) == 2
    await bus.delete_consumer(TRAINING_TASK_STREAM, f"w-{unique}")

    with pytest.raises(RequestFailed, match="NoResponders"):
        await bus.request(f"test.{unique}.nobody", b"?", timeout=2)


async def test_kv_key_listings_leave_no_consumers_behind(bus: Bus, unique: str) -> None:
    # A coordinator lists its trainers twice a second; a listing's consumer left behind
    # would bring the bucket's stream to JetStream's 1,000-consumer limit within minutes.
    kv = await bus.kv(f"keys_{unique}")
    assert await kv.keys() == []
    await kv.put("kept", pod_changed(unique, "a"))
    await kv.put("gone", pod_changed(unique, "b"))
    await kv.delete("gone")
    for _ in range(50):  # every listing complete: none ends before its keys arrive
        assert await kv.keys() == ["kept"]
    assert (await bus.js.stream_info(f"KV_keys_{unique}")).state.consumer_count == 0
    many = [f"k{index:03d}" for index in range(600)]  # more than one fetch
    for key in many:
        await kv.put(key, pod_changed(unique, key))
    assert sorted(await kv.keys()) == sorted([*many, "kept"])
