"""The NATS bus: the only service module that imports `nats`.

Typed publish and subscribe over `events.Subject`s, JetStream streams and durable consumers
declared in one place (`STREAMS`), a KV helper, a lease on KV for single-leader services, an
object store and raw request/reply for the trainers. Received messages that are not valid
events are never raised into a service's loop: they are logged, counted and republished to
`tideshift.v1.deadletter.<consumer>` with the reason.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import socket
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Generic, TypeVar

import nats
import nats.errors
import nats.js.errors
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.js import JetStreamContext
from nats.js.api import (
    AckPolicy,
    ConsumerConfig,
    DeliverPolicy,
    DiscardPolicy,
    RetentionPolicy,
    StorageType,
    StreamConfig,
)
from nats.js.kv import KeyValue
from nats.js.object_store import ObjectStore
from prometheus_client import Counter
from pydantic import BaseModel

from tideshift.events import (
    DEAD_LETTER,
    BoundSubject,
    DeadLetter,
    Envelope,
    EventData,
    EventRejected,
)
from tideshift.events.codec import decode, encode

log = logging.getLogger("tideshift.bus")
T = TypeVar("T", bound=EventData)
M = TypeVar("M", bound=BaseModel)

PUBLISHED = Counter("tideshift_bus_published_total", "Events published", ["subject_root"])
RECEIVED = Counter("tideshift_bus_received_total", "Valid events received", ["consumer"])
REJECTED = Counter(
    "tideshift_bus_rejected_total", "Messages rejected and dead-lettered", ["consumer", "kind"]
)
DEAD_LETTER_PAYLOAD_CHARS = 1024


@dataclass(frozen=True)
class StreamSpec:
    """A JetStream stream: what it captures and how long it keeps it."""

    name: str
    subjects: tuple[str, ...]
    retention: RetentionPolicy = RetentionPolicy.LIMITS
    max_age_seconds: float = 24 * 3600
    duplicate_window_seconds: float = 120

    def config(self) -> StreamConfig:
        return StreamConfig(
            name=self.name,
            subjects=list(self.subjects),
            retention=self.retention,
            max_age=self.max_age_seconds,
            duplicate_window=self.duplicate_window_seconds,
            storage=StorageType.FILE,
            discard=DiscardPolicy.OLD,
        )


# Everything that must not be lost, in one place. Telemetry (cluster changes, forecasts,
# plans, progress) is core NATS: a missed one is superseded by the next.
SCALE_STREAM = StreamSpec("TIDESHIFT_SCALE", ("tideshift.v1.scale.>",))
TRAINING_TASK_STREAM = StreamSpec(
    "TIDESHIFT_TRAINING_TASKS",
    ("tideshift.v1.training.task.>",),
    retention=RetentionPolicy.WORK_QUEUE,
    max_age_seconds=7 * 24 * 3600,
)
DEAD_LETTER_STREAM = StreamSpec(
    "TIDESHIFT_DEADLETTER", ("tideshift.v1.deadletter.>",), max_age_seconds=7 * 24 * 3600
)
STREAMS: tuple[StreamSpec, ...] = (SCALE_STREAM, TRAINING_TASK_STREAM, DEAD_LETTER_STREAM)


@dataclass
class Delivery(Generic[T]):
    """One JetStream message: the decoded event plus its acknowledgement controls."""

    event: Envelope[T]
    _msg: Msg

    @property
    def num_delivered(self) -> int:
        return int(self._msg.metadata.num_delivered)

    @property
    def stream_sequence(self) -> int:
        return int(self._msg.metadata.sequence.stream)

    async def ack(self) -> None:
        """Acknowledge and wait for the server's confirmation (so a crash cannot lose it)."""
        await self._msg.ack_sync()

    async def nak(self, delay_seconds: float | None = None) -> None:
        await self._msg.nak(delay=delay_seconds)

    async def in_progress(self) -> None:
        """Reset the ack timer of a long-running task."""
        await self._msg.in_progress()

    async def term(self) -> None:
        """Never redeliver (the message is poison)."""
        await self._msg.term()


# JetStream's error code for a compare-and-set that lost (some servers send it as a plain
# bad request rather than as KeyWrongLastSequenceError).
WRONG_LAST_SEQUENCE = 10071


class KVConflict(RuntimeError):
    """A compare-and-set on a KV key lost: someone else wrote it since it was read."""


class RequestFailed(RuntimeError):
    """A request got no usable answer: timeout, no responder, or a lost connection."""


@dataclass
class Lease:
    """Single-leader election on a KV key with compare-and-set and a time-to-live.

    The value holds the holder's name and an expiry time. A contender takes the key when it
    is absent (create) or expired (update at the revision it read), so two contenders can
    never both succeed; the holder renews with the same compare-and-set before expiry.
    Clocks of contenders are assumed roughly in sync (well under the TTL).
    """

    kv: KeyValue
    key: str
    holder: str
    ttl_seconds: float
    _revision: int | None = field(default=None, init=False)

    @property
    def held(self) -> bool:
        return self._revision is not None

    async def try_acquire(self, now: datetime | None = None) -> bool:
        """Acquire or renew; returns whether this holder leads now."""
        now = now or datetime.now(UTC)
        value = json.dumps(
            {"holder": self.holder, "expires_at": now.timestamp() + self.ttl_seconds}
        ).encode()
        try:
            entry = await self.kv.get(self.key)
        except (nats.js.errors.KeyNotFoundError, nats.js.errors.KeyDeletedError):
            entry = None
        try:
            if entry is None or entry.value is None:
                self._revision = await self.kv.create(self.key, value)
                return True
            current = json.loads(entry.value)
            mine = current.get("holder") == self.holder
            expired = float(current.get("expires_at", 0)) <= now.timestamp()
            if not (mine or expired):
                self._revision = None
                return False
            self._revision = await self.kv.update(self.key, value, last=entry.revision)
            return True
        except (nats.js.errors.KeyWrongLastSequenceError, nats.js.errors.BadRequestError):
            # Someone else wrote between our read and our write: they won this round.
            self._revision = None
            return False
        except (json.JSONDecodeError, TypeError, ValueError, AttributeError):
            log.warning("lease %s holds an unreadable value; taking it over", self.key)
            self._revision = await self.kv.put(self.key, value)
            return True

    async def release(self) -> None:
        if self._revision is None:
            return
        with contextlib.suppress(nats.js.errors.Error):
            await self.kv.delete(self.key, last=self._revision)
        self._revision = None


class TypedKV:
    """A KV bucket holding pydantic models as JSON, under escaped keys."""

    def __init__(self, kv: KeyValue) -> None:
        self.raw = kv

    async def put(self, key: str, value: BaseModel) -> int:
        return await self.raw.put(key, value.model_dump_json().encode())

    async def get(self, key: str, model: type[M]) -> M | None:
        value, _ = await self.get_revision(key, model)
        return value

    async def get_revision(self, key: str, model: type[M]) -> tuple[M | None, int | None]:
        """The value and the revision to pass to `update`: (None, None) when absent, and
        (None, revision) when the stored value no longer validates (logged), so a caller can
        overwrite a damaged value by compare-and-set instead of failing on it."""
        try:
            entry = await self.raw.get(key)
        except (nats.js.errors.KeyNotFoundError, nats.js.errors.KeyDeletedError):
            return None, None
        if entry.value is None:
            return None, entry.revision
        try:
            return model.model_validate_json(entry.value), entry.revision
        except ValueError as error:
            log.warning("KV %s: unreadable value at %s: %s", self.raw._name, key, error)
            return None, entry.revision

    async def update(self, key: str, value: BaseModel, *, revision: int | None) -> int:
        """Compare-and-set: write only if the key is still at `revision` (None = absent)."""
        data = value.model_dump_json().encode()
        try:
            if revision is None:
                return await self.raw.create(key, data)
            return await self.raw.update(key, data, last=revision)
        except nats.js.errors.KeyWrongLastSequenceError as error:
            raise KVConflict(f"{key}: {error}") from error
        except nats.js.errors.BadRequestError as error:
            if error.err_code == WRONG_LAST_SEQUENCE:
                raise KVConflict(f"{key}: {error}") from error
            raise

    async def delete(self, key: str) -> None:
        with contextlib.suppress(nats.js.errors.KeyNotFoundError):
            await self.raw.delete(key)

    async def keys(self) -> list[str]:
        try:
            return list(await self.raw.keys())
        except nats.js.errors.NoKeysError:
            return []

    async def items(self, model: type[M]) -> AsyncIterator[tuple[str, M]]:
        """Every current value that still validates; bad values are logged and skipped."""
        for key in await self.keys():
            value = await self.get(key, model)
            if value is not None:
                yield key, value


class Bus:
    """A connected NATS client with Tideshift's typed helpers."""

    def __init__(self, connection: Client, *, source: str, max_message_bytes: int) -> None:
        self.connection = connection
        self.js: JetStreamContext = connection.jetstream()
        self.source = source
        self.max_message_bytes = max_message_bytes

    @classmethod
    async def connect(
        cls,
        url: str,
        *,
        name: str,
        credentials: str | None = None,
        max_message_bytes: int = 1024 * 1024,
        connect_timeout: float = 30.0,
    ) -> Bus:
        """Connect (ConnectionError after `connect_timeout`); once up, reconnect for ever."""

        async def on_disconnect() -> None:
            log.warning("disconnected from NATS %s; reconnecting", url)

        async def on_reconnect() -> None:
            log.info("reconnected to NATS %s", url)

        async def on_error(error: Exception) -> None:
            log.warning("NATS error: %s", error)

        try:
            connection = await asyncio.wait_for(
                nats.connect(
                    url,
                    name=name,
                    user_credentials=credentials,
                    max_reconnect_attempts=-1,
                    reconnect_time_wait=0.5,
                    allow_reconnect=True,
                    disconnected_cb=on_disconnect,
                    reconnected_cb=on_reconnect,
                    error_cb=on_error,
                ),
                connect_timeout,
            )
        except (TimeoutError, nats.errors.NoServersError, OSError) as error:
            raise ConnectionError(
                f"no NATS server answered at {url} within {connect_timeout:.0f}s"
            ) from error
        source = f"tideshift/{name}/{socket.gethostname()}/{os.getpid()}"
        return cls(connection, source=source, max_message_bytes=max_message_bytes)

    async def close(self) -> None:
        """Drain: finish in-flight handlers and flush pending publishes, then disconnect."""
        if not self.connection.is_closed:
            with contextlib.suppress(nats.errors.Error, asyncio.TimeoutError):
                await self.connection.drain()

    @property
    def connected(self) -> bool:
        return bool(self.connection.is_connected)

    # -- streams -----------------------------------------------------------------------

    async def ensure_streams(self, streams: tuple[StreamSpec, ...] = STREAMS) -> None:
        """Create or update every stream; safe to call from every service at start."""
        for spec in streams:
            try:
                await self.js.add_stream(spec.config())
            except nats.js.errors.BadRequestError:
                await self.js.update_stream(spec.config())

    # -- publish -----------------------------------------------------------------------

    def _encode(self, subject: BoundSubject[T], data: T) -> bytes:
        if subject.is_wildcard:
            raise ValueError(f"cannot publish to wildcard subject {subject.value}")
        if not isinstance(data, subject.model):
            raise TypeError(
                f"{subject.subject.pattern} carries {subject.model.__name__}, "
                f"not {type(data).__name__}"
            )
        return encode(data, source=self.source, subject=subject.value)

    async def publish(self, subject: BoundSubject[T], data: T) -> None:
        """Fire-and-forget on core NATS (telemetry)."""
        await self.connection.publish(subject.value, self._encode(subject, data))
        PUBLISHED.labels(subject.subject.pattern.split(".")[2]).inc()

    async def publish_durable(
        self, subject: BoundSubject[T], data: T, *, msg_id: str | None = None
    ) -> int:
        """Publish to JetStream and wait for the stream's ack; `msg_id` de-duplicates."""
        headers = {"Nats-Msg-Id": msg_id} if msg_id else None
        ack = await self.js.publish(subject.value, self._encode(subject, data), headers=headers)
        PUBLISHED.labels(subject.subject.pattern.split(".")[2]).inc()
        return int(ack.seq)

    # -- receive -----------------------------------------------------------------------

    async def _reject(self, consumer: str, subject: str, raw: bytes, error: EventRejected) -> None:
        REJECTED.labels(consumer, error.kind).inc()
        log.warning("%s rejected a message on %s: %s", consumer, subject, error.reason)
        letter = DeadLetter(
            consumer=consumer,
            original_subject=subject,
            reason=error.reason,
            payload=raw[:DEAD_LETTER_PAYLOAD_CHARS].decode("utf-8", errors="replace"),
            payload_bytes=len(raw),
            received_at=datetime.now(UTC),
        )
        try:
            await self.publish_durable(DEAD_LETTER.at(consumer=consumer), letter)
        except (TimeoutError, nats.errors.Error) as publish_error:
            log.error("could not dead-letter a message from %s: %s", subject, publish_error)

    def _decode(self, raw: bytes, expected: type[T] | None) -> Envelope[T]:
        return decode(raw, expected, max_bytes=self.max_message_bytes)

    async def subscribe(
        self,
        subject: BoundSubject[T],
        *,
        consumer: str,
        queue: str | None = None,
        buffer: int = 1024,
    ) -> AsyncIterator[Envelope[T]]:
        """Valid events on a (wildcard) subject from core NATS, until the caller stops.

        At most `buffer` messages wait in memory; beyond that NATS marks this subscriber as a
        slow consumer and drops, which is the right trade-off for superseded telemetry.
        """
        inbox: asyncio.Queue[Msg] = asyncio.Queue(maxsize=buffer)

        async def deliver(msg: Msg) -> None:
            await inbox.put(msg)

        subscription = await self.connection.subscribe(
            subject.value, queue=queue or "", cb=deliver, pending_msgs_limit=buffer
        )
        try:
            while True:
                msg = await inbox.get()
                try:
                    envelope = self._decode(msg.data, subject.model)
                except EventRejected as error:
                    await self._reject(consumer, msg.subject, msg.data, error)
                    continue
                RECEIVED.labels(consumer).inc()
                yield envelope
        finally:
            with contextlib.suppress(nats.errors.Error):
                await subscription.unsubscribe()

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
        """Deliveries from a durable pull consumer; the caller acks each one.

        Several processes using the same `durable` share the work. Invalid messages are
        dead-lettered and terminated here, so the caller only ever sees valid events.
        """
        config = ConsumerConfig(
            durable_name=durable,
            ack_policy=AckPolicy.EXPLICIT,
            deliver_policy=DeliverPolicy.ALL,
            ack_wait=ack_wait_seconds,
            max_deliver=max_deliver,
            max_ack_pending=max_ack_pending,
            filter_subject=subject.value,
        )
        subscription = await self.js.pull_subscribe(
            subject.value, durable=durable, stream=stream.name, config=config
        )
        try:
            while True:
                try:
                    messages = await subscription.fetch(batch, timeout=fetch_timeout)
                except (TimeoutError, nats.errors.TimeoutError):
                    continue
                except (nats.errors.ConnectionClosedError, nats.errors.ConnectionReconnectingError):
                    await asyncio.sleep(0.2)
                    continue
                for msg in messages:
                    try:
                        envelope = self._decode(msg.data, subject.model)
                    except EventRejected as error:
                        await self._reject(durable, msg.subject, msg.data, error)
                        await msg.term()
                        continue
                    RECEIVED.labels(durable).inc()
                    yield Delivery(envelope, msg)
        finally:
            with contextlib.suppress(nats.errors.Error):
                await subscription.unsubscribe()

    # -- key/value, leases, objects ----------------------------------------------------

    async def kv(
        self, bucket: str, *, ttl_seconds: float | None = None, history: int = 1
    ) -> TypedKV:
        return TypedKV(await self.raw_kv(bucket, ttl_seconds=ttl_seconds, history=history))

    async def raw_kv(
        self, bucket: str, *, ttl_seconds: float | None = None, history: int = 1
    ) -> KeyValue:
        try:
            return await self.js.key_value(bucket)
        except nats.js.errors.BucketNotFoundError:
            return await self.js.create_key_value(bucket=bucket, ttl=ttl_seconds, history=history)

    async def lease(self, name: str, *, holder: str, ttl_seconds: float) -> Lease:
        kv = await self.raw_kv("tideshift_leases")
        return Lease(kv, name, holder, ttl_seconds)

    async def object_store(self, bucket: str) -> ObjectStore:
        try:
            return await self.js.object_store(bucket)
        except nats.js.errors.BucketNotFoundError:
            return await self.js.create_object_store(bucket=bucket)

    async def put_object(self, bucket: str, name: str, data: bytes) -> None:
        store = await self.object_store(bucket)
        await store.put(name, data)

    async def get_object(self, bucket: str, name: str) -> bytes | None:
        """The object's bytes, or None when it does not exist."""
        store = await self.object_store(bucket)
        try:
            result = await store.get(name)
        except (nats.js.errors.ObjectNotFoundError, nats.js.errors.ObjectDeletedError):
            return None
        return bytes(result.data) if result.data is not None else None

    async def queued(self, subject: BoundSubject[T], *, stream: StreamSpec) -> int:
        """Messages stored in `stream` on exactly `subject` (on a work queue: not yet acked)."""
        info = await self.js.stream_info(stream.name, subjects_filter=subject.value)
        return int((info.state.subjects or {}).get(subject.value, 0))

    async def delete_consumer(self, stream: StreamSpec, durable: str) -> None:
        with contextlib.suppress(nats.js.errors.NotFoundError):
            await self.js.delete_consumer(stream.name, durable)

    # -- raw request/reply (binary payloads between trainers and parameter servers) ----

    async def request(self, subject: str, payload: bytes, *, timeout: float = 5.0) -> bytes:
        """Send a request and return the reply; RequestFailed when none comes."""
        try:
            reply = await self.connection.request(subject, payload, timeout=timeout)
        except (nats.errors.Error, TimeoutError) as error:
            raise RequestFailed(f"{subject}: {type(error).__name__}: {error}") from error
        data: bytes = reply.data
        return data

    async def serve(
        self,
        subject: str,
        handler: Callable[[bytes], Awaitable[bytes]],
        *,
        queue: str | None = None,
    ) -> Callable[[], Awaitable[None]]:
        """Answer requests on `subject` with `handler`; returns a function that stops serving.

        A handler that raises answers with an `error: ...` payload instead of leaving the
        requester to time out.
        """

        async def answer(msg: Msg) -> None:
            try:
                response = await handler(msg.data)
            except Exception as error:  # one bad request must not stop the server
                log.warning("request on %s failed: %s", msg.subject, error)
                response = f"error: {error}".encode()
            if msg.reply:
                await msg.respond(response)

        subscription = await self.connection.subscribe(subject, queue=queue or "", cb=answer)

        async def stop() -> None:
            with contextlib.suppress(nats.errors.Error):
                await subscription.unsubscribe()

        return stop
