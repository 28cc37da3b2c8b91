"""Poison on a real nats-server: a rejected JetStream message is terminated and dead-lettered
once, and the consumer goes on to the next message (the trainer crash of issue 13)."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime

from prometheus_client import REGISTRY

from tests.fixtures.support import eventually
from tideshift import events
from tideshift.services.common.bus import DEAD_LETTER_STREAM, TRAINING_TASK_STREAM, Bus

WAIT = 10.0
NOW = datetime(2026, 1, 1, tzinfo=UTC)


async def _consumer_settled(bus: Bus, durable: str) -> tuple[int, int]:
    """(pending acks, redeliveries) once nothing is pending."""

    async def settled() -> tuple[int, int] | None:
        info = await bus.js.consumer_info(TRAINING_TASK_STREAM.name, durable)
        return (info.num_ack_pending, info.num_redelivered) if info.num_ack_pending == 0 else None

    return await eventually(settled, WAIT, message="acks still pending")


async def test_deeply_nested_shard_task_is_terminated_and_the_trainer_path_goes_on(
    bus: Bus, unique: str
) -> None:
    job = f"job-{unique}"
    durable = f"trainer-{unique}"
    subject = events.SHARD_TASK.at(job=job)
    await bus.js.publish(subject.value, b"[" * 100_000)
    good = events.ShardTask(job=job, epoch=0, shard=1, shards=2, issued_at=NOW)
    await bus.publish_durable(subject, good)

    deliveries = bus.consume(
        subject, stream=TRAINING_TASK_STREAM, durable=durable, ack_wait_seconds=1.0
    )
    delivery = await asyncio.wait_for(anext(deliveries), WAIT)
    assert delivery.event.data == good, "the poison is skipped, the next task is delivered"
    await delivery.ack()
    await deliveries.aclose()

    pending, redelivered = await _consumer_settled(bus, durable)
    assert (pending, redelivered) == (0, 0), "the poison was terminated, not left to redeliver"
    rejected = REGISTRY.get_sample_value(
        "tideshift_bus_rejected_total", {"consumer": durable, "kind": "too_deep"}
    )
    assert rejected == 1

    letters = bus.consume(
        events.DEAD_LETTER.at(consumer=durable),
        stream=DEAD_LETTER_STREAM,
        durable=f"read-{unique}",
    )
    letter = await asyncio.wait_for(anext(letters), WAIT)
    await letter.ack()
    await letters.aclose()
    assert letter.event.data.original_subject == subject.value
    assert letter.event.data.reason == "JSON nested too deeply"
    assert letter.event.data.payload_bytes == 100_000


async def test_a_lease_holding_a_hostile_value_is_taken_over(bus: Bus, unique: str) -> None:
    lease = await bus.lease(f"poisoned-{unique}", holder="me", ttl_seconds=10)
    await lease.kv.put(lease.key, b"[" * 100_000)
    assert await lease.try_acquire(NOW), "the unreadable value does not block the election"
    assert lease.held
    entry = await lease.kv.get(lease.key)
    assert entry.value is not None and b'"holder": "me"' in entry.value
