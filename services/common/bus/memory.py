"""The bus in one process: `MemoryBus`, the `BusPort` of tests that need no nats-server.

A `MemoryBroker` plays the server (streams, durable consumers, KV buckets, objects,
responders); each `MemoryBus` is one service's connection to it. What services rely on is
kept: core subscribers get what is published while they listen (queue groups share it, a
full buffer drops and says so); a durable publish is stored in its stream, de-duplicated by
its id within the stream's window, and seen by core subscribers too; a durable consumer
shares its messages among its readers, redelivers one not acked within `ack_wait_seconds`
or handed back (`nak`, after its delay), and stops after `max_deliver`; invalid messages are
dead-lettered; KV keys carry revisions with compare-and-set, and expire with the bucket's
TTL; leases expire. Every timer runs on the injected `Clock`, so a test advances virtual time
instead of waiting. Not kept: clustering, permissions, reconnection, byte limits.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

import nats.errors
import nats.js.errors
from nats.js.api import RetentionPolicy
from nats.js.kv import KeyValue
from pydantic import BaseModel

from tideshift.events import (
    DEAD_LETTER,
    LEASES_BUCKET,
    BoundSubject,
    Envelope,
    EventData,
    EventRejected,
)
from tideshift.events.codec import decode
from tideshift.services.common.bus.client import (
    RECEIVED,
    Bus,
    check_core,
    check_durable,
    dead_letter,
    encode_event,
)
from tideshift.services.common.bus.delivery import Delivery
from tideshift.services.common.bus.drops import SlowConsumers
from tideshift.services.common.bus.kv import Lease, TypedKV
from tideshift.services.common.bus.port import BusPort
from tideshift.services.common.bus.rpc import RequestFailed, answer
from tideshift.services.common.bus.streams import (
    HISTORY_STREAM,
    STREAMS,
    StreamSpec,
)
from tideshift.services.common.clock import WALL_CLOCK, Clock, utc_now, wait_for_event

T = TypeVar("T", bound=EventData)


def subject_matches(pattern: str, subject: str) -> bool:
    """NATS subject matching: `*` is one token, a final `>` one or more."""
    wanted, tokens = pattern.split("."), subject.split(".")
    for index, token in enumerate(wanted):
        if token == ">":
            return len(tokens) > index
        if index >= len(tokens) or token not in {"*", tokens[index]}:
            return False
    return len(wanted) == len(tokens)


class _Signal:
    """Wakes everyone waiting for a change (a message stored, settled or handed back)."""

    def __init__(self) -> None:
        self.event = asyncio.Event()

    def fire(self) -> None:
        self.event.set()
        self.event = asyncio.Event()


@dataclass
class _Stored:
    seq: int
    subject: str
    data: bytes
    stored_at: float


@dataclass
class _Pending:
    deliveries: int
    due: float  # when it is delivered again unless acked


@dataclass
class _Consumer:
    filter: str
    ack_wait: float
    max_deliver: int
    max_ack_pending: int
    next_seq: int = 1
    # Delivered and not yet settled; one delivered max_deliver times and never acked leaves
    # it unsettled and is not delivered again (JetStream stops there, and so does this).
    pending: dict[int, _Pending] = field(default_factory=dict)


@dataclass
class _Stream:
    spec: StreamSpec
    messages: dict[int, _Stored] = field(default_factory=dict)
    last_seq: int = 0
    ids: dict[str, tuple[int, float]] = field(default_factory=dict)
    consumers: dict[str, _Consumer] = field(default_factory=dict)

    def holds(self, subject: str) -> bool:
        return any(subject_matches(pattern, subject) for pattern in self.spec.subjects)

    def store(self, subject: str, data: bytes, msg_id: str | None, now: float) -> int:
        window = self.spec.duplicate_window_seconds
        self.ids = {key: seen for key, seen in self.ids.items() if seen[1] > now - window}
        if msg_id is not None and msg_id in self.ids:
            return self.ids[msg_id][0]
        self.last_seq += 1
        self.messages[self.last_seq] = _Stored(self.last_seq, subject, data, now)
        if msg_id is not None:
            self.ids[msg_id] = (self.last_seq, now)
        self._trim(now)
        return self.last_seq

    def _trim(self, now: float) -> None:
        oldest = now - self.spec.max_age_seconds
        for seq in [seq for seq, stored in self.messages.items() if stored.stored_at < oldest]:
            del self.messages[seq]
        while 0 < self.spec.max_msgs < len(self.messages):
            del self.messages[next(iter(self.messages))]

    def take(self, consumer: _Consumer, now: float) -> tuple[_Stored, int] | None:
        """The next message for `consumer` (a due redelivery first) and its delivery count."""
        for seq, pending in sorted(consumer.pending.items()):
            if seq not in self.messages:
                del consumer.pending[seq]
            elif pending.due <= now:
                if 0 < consumer.max_deliver <= pending.deliveries:
                    del consumer.pending[seq]
                    continue
                pending.deliveries += 1
                pending.due = now + consumer.ack_wait
                return self.messages[seq], pending.deliveries
        if len(consumer.pending) >= consumer.max_ack_pending:
            return None
        for seq, stored in self.messages.items():
            if seq >= consumer.next_seq and subject_matches(consumer.filter, stored.subject):
                consumer.next_seq = seq + 1
                consumer.pending[seq] = _Pending(1, now + consumer.ack_wait)
                return stored, 1
        return None

    def settled(self, seq: int) -> None:
        """Acked (or terminated): a work queue forgets it."""
        if self.spec.retention == RetentionPolicy.WORK_QUEUE:
            self.messages.pop(seq, None)


@dataclass
class _Metadata:
    num_delivered: int


class _Settle:
    """A delivery's acknowledgement controls, on the broker's consumer state."""

    def __init__(
        self, broker: MemoryBroker, stream: _Stream, consumer: _Consumer, seq: int, count: int
    ) -> None:
        self.broker, self.stream, self.consumer, self.seq = broker, stream, consumer, seq
        self.metadata = _Metadata(count)

    async def ack_sync(self, timeout: float = 1.0) -> object:
        if self.consumer.pending.pop(self.seq, None) is not None:
            self.stream.settled(self.seq)
        self.broker.changed.fire()
        return self

    async def nak(self, delay: float | None = None) -> None:
        pending = self.consumer.pending.get(self.seq)
        if pending is not None:
            pending.due = self.broker.clock.now() + (delay or 0.0)
        self.broker.changed.fire()

    async def in_progress(self) -> None:
        pending = self.consumer.pending.get(self.seq)
        if pending is not None:
            pending.due = self.broker.clock.now() + self.consumer.ack_wait
        self.broker.changed.fire()

    async def term(self) -> None:
        await self.ack_sync()


@dataclass
class _Entry:
    value: bytes | None
    revision: int
    operation: str | None  # None: a value; "DEL" or "PURGE": removed
    written_at: float
    ttl: float | None


class MemoryKeyValue:
    """The part of nats-py's `KeyValue` that `TypedKV` and `Lease` use, with its errors."""

    def __init__(self, name: str, clock: Clock, *, ttl: float | None, counter: Any) -> None:
        self._name = name
        self._clock = clock
        self._ttl = ttl
        self._revisions = counter
        self._entries: dict[str, _Entry] = {}

    def _current(self, key: str) -> _Entry | None:
        entry = self._entries.get(key)
        if entry is None:
            return None
        ttl = entry.ttl if entry.ttl is not None else self._ttl
        if ttl is not None and entry.written_at + ttl <= self._clock.now():
            del self._entries[key]
            return None
        return entry

    def _write(self, key: str, value: bytes | None, op: str | None, ttl: float | None) -> int:
        revision = int(next(self._revisions))
        self._entries[key] = _Entry(value, revision, op, self._clock.now(), ttl)
        return revision

    def _expect(self, key: str, last: int | None) -> None:
        entry = self._current(key)
        if (entry.revision if entry is not None else 0) != (last or 0):
            raise nats.js.errors.KeyWrongLastSequenceError(
                description=f"wrong last sequence: {entry.revision if entry else 0}"
            )

    async def get(self, key: str) -> KeyValue.Entry:
        entry = self._current(key)
        if entry is None:
            raise nats.js.errors.KeyNotFoundError
        if entry.operation is not None:
            raise nats.js.errors.KeyDeletedError
        return KeyValue.Entry(self._name, key, entry.value, entry.revision, None, None, None)

    async def put(self, key: str, value: bytes, *, ttl: float | None = None) -> int:
        return self._write(key, value, None, ttl)

    async def create(self, key: str, value: bytes) -> int:
        entry = self._current(key)
        if entry is not None and entry.operation is None:
            raise nats.js.errors.KeyWrongLastSequenceError(description="key exists")
        return self._write(key, value, None, None)

    async def update(self, key: str, value: bytes, last: int | None = None) -> int:
        self._expect(key, last)
        return self._write(key, value, None, None)

    async def delete(self, key: str, last: int | None = None) -> bool:
        if last is not None:
            self._expect(key, last)
        if self._current(key) is None:
            raise nats.js.errors.KeyNotFoundError
        self._write(key, None, "DEL", None)
        return True

    async def purge(self, key: str, msg_ttl: float | None = None) -> bool:
        self._write(key, None, "PURGE", msg_ttl)
        return True

    def live(self) -> dict[str, bytes]:
        """Every key that holds a value."""
        values = {key: self._current(key) for key in list(self._entries)}
        return {
            key: entry.value
            for key, entry in values.items()
            if entry is not None and entry.operation is None and entry.value is not None
        }


class MemoryTypedKV(TypedKV):
    """`TypedKV` over a `MemoryKeyValue`: the listing reads the bucket, not a JetStream consumer."""

    def __init__(self, raw: MemoryKeyValue, *, bucket: str) -> None:
        self.raw = raw  # type: ignore[assignment]
        self.bucket = bucket
        self.memory = raw

    async def expires_keys(self) -> bool:
        return True

    async def put_expiring(self, key: str, value: BaseModel, *, ttl_seconds: int) -> None:
        await self.memory.put(key, value.model_dump_json().encode(), ttl=float(ttl_seconds))

    async def purge_expiring(self, key: str, *, ttl_seconds: int) -> None:
        await self.memory.purge(key, msg_ttl=float(ttl_seconds))

    async def keys(self) -> list[str]:
        return list(self.memory.live())

    async def values(self) -> dict[str, bytes]:
        return self.memory.live()


@dataclass(eq=False)  # hashable by identity, as nats-py's subscriptions are
class _Subscription:
    """One core subscriber: what it listens to and what waits for it."""

    pattern: str
    queue: str | None
    inbox: asyncio.Queue[tuple[str, bytes]]
    bus: MemoryBus
    pending_msgs: int = 0  # read by `SlowConsumers` (nats-py's own buffer; none here)


@dataclass
class _Responder:
    pattern: str
    queue: str | None
    handler: Callable[[bytes], Awaitable[bytes]]


class MemoryBroker:
    """The in-memory server every `MemoryBus` of one test shares."""

    def __init__(self, clock: Clock = WALL_CLOCK) -> None:
        self.clock = clock
        self.changed = _Signal()
        self.streams: dict[str, _Stream] = {}
        self.subscriptions: list[_Subscription] = []
        self.responders: list[_Responder] = []
        self.buckets: dict[str, MemoryKeyValue] = {}
        self.objects: dict[str, dict[str, bytes]] = {}
        self._turns = itertools.count()
        self._revisions = itertools.count(1)
        for spec in (*STREAMS, HISTORY_STREAM):
            self.add_stream(spec)

    def connect(self, name: str = "test", *, max_message_bytes: int = 1024 * 1024) -> MemoryBus:
        return MemoryBus(
            self, source=f"tideshift/{name}/memory", max_message_bytes=max_message_bytes
        )

    def add_stream(self, spec: StreamSpec) -> None:
        if spec.name in self.streams:
            self.streams[spec.name].spec = spec
            return
        self.streams[spec.name] = _Stream(spec)

    def stream_of(self, subject: str) -> _Stream:
        for stream in self.streams.values():
            if stream.holds(subject) and not stream.spec.sources:
                return stream
        raise nats.errors.NoRespondersError

    def fan_out(self, subject: str, data: bytes) -> None:
        """Hand a message to every core subscriber on its subject (one per queue group)."""
        groups: dict[str, list[_Subscription]] = {}
        for subscription in self.subscriptions:
            if not subject_matches(subscription.pattern, subject):
                continue
            if subscription.queue:
                groups.setdefault(subscription.queue, []).append(subscription)
            else:
                self._offer(subscription, subject, data)
        for members in groups.values():
            self._offer(members[next(self._turns) % len(members)], subject, data)

    def _offer(self, subscription: _Subscription, subject: str, data: bytes) -> None:
        try:
            subscription.inbox.put_nowait((subject, data))
        except asyncio.QueueFull:
            error = nats.errors.SlowConsumerError(subject, "", 0, subscription)  # type: ignore[arg-type]
            subscription.bus.slow_consumers.report(error)

    def bucket(self, name: str, ttl_seconds: float | None) -> MemoryKeyValue:
        if name not in self.buckets:
            self.buckets[name] = MemoryKeyValue(
                name, self.clock, ttl=ttl_seconds, counter=self._revisions
            )
        return self.buckets[name]


class MemoryBus:
    """One connection to a `MemoryBroker`: the `BusPort` over it."""

    def __init__(
        self, broker: MemoryBroker, *, source: str, max_message_bytes: int = 1024 * 1024
    ) -> None:
        self.broker = broker
        self.source = source
        self.max_message_bytes = max_message_bytes
        self.replicas = 1
        self.slow_consumers = SlowConsumers()
        self._closed = False

    @property
    def connected(self) -> bool:
        return not self._closed

    async def close(self) -> None:
        self._closed = True

    async def flush(self, timeout: int = 10) -> None:
        await asyncio.sleep(0)

    async def ensure_streams(self, streams: tuple[StreamSpec, ...] = STREAMS) -> None:
        for spec in streams:
            self.broker.add_stream(spec)

    # -- publish -----------------------------------------------------------------------

    async def publish(self, subject: BoundSubject[T], data: T) -> None:
        check_core(subject)
        self.broker.fan_out(subject.value, encode_event(subject, data, source=self.source))

    async def publish_durable(
        self, subject: BoundSubject[T], data: T, *, msg_id: str | None = None
    ) -> int:
        check_durable(subject)
        return await self._store(
            subject.value, encode_event(subject, data, source=self.source), msg_id
        )

    async def _store(self, subject: str, data: bytes, msg_id: str | None) -> int:
        stream = self.broker.stream_of(subject)
        seq = stream.store(subject, data, msg_id, self.broker.clock.now())
        # As on NATS: a duplicate is not stored again, but core subscribers see each publish.
        self.broker.fan_out(subject, data)
        self.broker.changed.fire()
        return seq

    # -- receive -----------------------------------------------------------------------

    async def _valid(
        self, consumer: str, subject: str, raw: bytes, model: type[T]
    ) -> Envelope[T] | None:
        try:
            envelope = decode(raw, model, max_bytes=self.max_message_bytes)
        except EventRejected as error:
            letter = dead_letter(consumer, subject, raw, error, at=utc_now(self.broker.clock))
            await self.publish_durable(DEAD_LETTER.at(consumer=consumer), letter)
            return None
        RECEIVED.labels(consumer).inc()
        return envelope

    async def subscribe(
        self,
        subject: BoundSubject[T],
        *,
        consumer: str,
        queue: str | None = None,
        buffer: int = 1024,
        on_drop: Callable[[], None] | None = None,
    ) -> AsyncIterator[Envelope[T]]:
        inbox: asyncio.Queue[tuple[str, bytes]] = asyncio.Queue(maxsize=buffer)
        subscription = _Subscription(subject.value, queue, inbox, self)
        self.broker.subscriptions.append(subscription)
        self.slow_consumers.register(subscription, consumer, on_drop, inbox.qsize)  # type: ignore[arg-type]
        try:
            while True:
                name, raw = await inbox.get()
                envelope = await self._valid(consumer, name, raw, subject.model)
                if envelope is not None:
                    yield envelope
        finally:
            self.slow_consumers.forget(subscription)  # type: ignore[arg-type]
            with contextlib.suppress(ValueError):
                self.broker.subscriptions.remove(subscription)

    async def consume(
        self,
        subject: BoundSubject[T],
        *,
        stream: StreamSpec,
        durable: str,
        ack_wait_seconds: float = 30.0,
        max_deliver: int = -1,
        max_ack_pending: int = 64,
        batch: int = 1,
        fetch_timeout: float = 1.0,
    ) -> AsyncIterator[Delivery[T]]:
        broker = self.broker
        kept = broker.streams[stream.name]
        consumer = kept.consumers.setdefault(
            durable, _Consumer(subject.value, ack_wait_seconds, max_deliver, max_ack_pending)
        )
        consumer.ack_wait, consumer.max_deliver = ack_wait_seconds, max_deliver
        consumer.max_ack_pending = max_ack_pending
        while True:
            signal = broker.changed.event
            now = broker.clock.now()
            taken = kept.take(consumer, now)
            if taken is None:
                await self._idle(consumer, signal, now)
                continue
            stored, count = taken
            settle = _Settle(broker, kept, consumer, stored.seq, count)
            envelope = await self._valid(durable, stored.subject, stored.data, subject.model)
            if envelope is None:
                await settle.term()
                continue
            yield Delivery(envelope, settle)

    async def _idle(self, consumer: _Consumer, signal: asyncio.Event, now: float) -> None:
        """Until a change, or the next redelivery falls due."""
        due = [pending.due for pending in consumer.pending.values()]
        if due:
            await wait_for_event(self.broker.clock, signal, max(0.0, min(due) - now))
        else:
            await signal.wait()

    # -- key/value, leases, objects ----------------------------------------------------

    async def kv(
        self, bucket: str, *, ttl_seconds: float | None = None, history: int = 1
    ) -> TypedKV:
        return MemoryTypedKV(self.broker.bucket(bucket, ttl_seconds), bucket=bucket)

    async def lease(self, name: str, *, holder: str, ttl_seconds: float) -> Lease:
        raw = self.broker.bucket(LEASES_BUCKET, None)
        return Lease(raw, name, holder, ttl_seconds, clock=self.broker.clock)  # type: ignore[arg-type]

    async def put_object(self, bucket: str, name: str, data: bytes) -> None:
        self.broker.objects.setdefault(bucket, {})[name] = bytes(data)

    async def get_object(self, bucket: str, name: str) -> bytes | None:
        return self.broker.objects.get(bucket, {}).get(name)

    async def queued(self, subject: BoundSubject[T], *, stream: StreamSpec) -> int:
        messages = self.broker.streams[stream.name].messages.values()
        return sum(1 for stored in messages if stored.subject == subject.value)

    async def delete_consumer(self, stream: StreamSpec, durable: str) -> None:
        self.broker.streams[stream.name].consumers.pop(durable, None)

    # -- raw request/reply -------------------------------------------------------------

    async def request(self, subject: str, payload: bytes, *, timeout: float = 5.0) -> bytes:
        responders = [r for r in self.broker.responders if subject_matches(r.pattern, subject)]
        if not responders:
            raise RequestFailed(f"{subject}: NoRespondersError: no responders")
        responder = responders[next(self.broker._turns) % len(responders)]
        try:
            return await asyncio.wait_for(answer(responder.handler, subject, payload), timeout)
        except TimeoutError as error:
            raise RequestFailed(f"{subject}: TimeoutError: {error}") from error

    async def serve(
        self,
        subject: str,
        handler: Callable[[bytes], Awaitable[bytes]],
        *,
        queue: str | None = None,
    ) -> Callable[[], Awaitable[None]]:
        responder = _Responder(subject, queue, handler)
        self.broker.responders.append(responder)

        async def stop() -> None:
            with contextlib.suppress(ValueError):
                self.broker.responders.remove(responder)

        return stop


def _implements_the_port(memory: MemoryBus, nats: Bus) -> tuple[BusPort, BusPort]:
    """Never called: mypy checks here that both buses implement `BusPort`."""
    return memory, nats
