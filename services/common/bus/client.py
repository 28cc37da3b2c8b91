"""The bus client: typed publish, subscribe and consume over `events.Subject`s.

Received messages that are not valid events are never raised into a service's loop: they are
logged, counted and dead-lettered to `tideshift.v1.deadletter.<consumer>` with the reason.
Key/value, leases, objects and raw request/reply live in their own modules; `Bus` is their
one face.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import UTC, datetime
from typing import TypeVar

import nats
import nats.errors
import nats.js.errors
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.js import JetStreamContext
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy, StreamConfig
from nats.js.kv import KeyValue
from prometheus_client import Counter

from tideshift.events import (
    DEAD_LETTER,
    LEASES_BUCKET,
    BoundSubject,
    DeadLetter,
    Envelope,
    EventData,
    EventRejected,
)
from tideshift.events.codec import decode, encode
from tideshift.services.common.bus import objects, rpc
from tideshift.services.common.bus.connect import open_connection
from tideshift.services.common.bus.delivery import Delivery
from tideshift.services.common.bus.drops import SlowConsumers
from tideshift.services.common.bus.kv import Lease, TypedKV
from tideshift.services.common.bus.streams import (
    STREAMS,
    StreamSpec,
    check_replicas,
    placement_failure,
)

log = logging.getLogger("tideshift.bus")
T = TypeVar("T", bound=EventData)

PUBLISHED = Counter("tideshift_bus_published_total", "Events published", ["subject_root"])
RECEIVED = Counter("tideshift_bus_received_total", "Valid events received", ["consumer"])
REJECTED = Counter(
    "tideshift_bus_rejected_total", "Messages rejected and dead-lettered", ["consumer", "kind"]
)
PERMISSION_VIOLATIONS = Counter(
    "tideshift_bus_permission_violations_total",
    "Operations the NATS server refused for lack of permission (a misconfigured identity)",
)
DEAD_LETTER_DISCARDS = Counter(
    "tideshift_bus_deadletters_discarded_total",
    "Dead letters this process wrote into a full dead-letter stream (each displaced the oldest)",
    ["consumer"],
)
DEAD_LETTER_PAYLOAD_CHARS = 1024
DEAD_LETTER_REASON_BYTES = 1024
# A letter's payload escaped as JSON (up to 6 bytes a character), its reason, names and headers.
LARGEST_DEAD_LETTER_BYTES = 6 * DEAD_LETTER_PAYLOAD_CHARS + DEAD_LETTER_REASON_BYTES + 2048
RECONNECT_POLL_SECONDS = 0.2
# Bytes a subscriber's buffer may hold per message it may hold: events are well under 2 KiB,
# so the message count is what bounds it, not nats-py's 64 MiB default.
EVENT_BYTES_BUDGET = 2048
# A fetch that failed with one of these is tried again shortly rather than failing the
# caller's `follow` into backoff. Reconnecting: the client never gives up and the pull
# subscription survives it. Closed: only `close()` does that, and the caller is stopping.
# Unavailable (503): the consumer's server died in a cluster and its copies elect a new
# leader, within seconds.
FETCH_AGAIN = (
    nats.errors.ConnectionClosedError,
    nats.errors.ConnectionReconnectingError,
    nats.js.errors.ServiceUnavailableError,
)
# What any bus operation may raise while a server or a stream's leader is briefly gone
# (reconnecting, or a cluster electing a new leader): for callers that try again later
# without importing nats.
BUS_UNAVAILABLE: tuple[type[Exception], ...] = (TimeoutError, nats.errors.Error)
# JetStream's answer to creating a stream that exists with another configuration.
STREAM_NAME_IN_USE = 10058


class Bus:
    """A connected NATS client with Tideshift's typed helpers.

    `replicas`: how many servers of a NATS cluster keep each stream and bucket this client
    creates (1 on a single server; 3 lets a cluster lose one server without losing a message).
    """

    def __init__(
        self,
        connection: Client,
        *,
        source: str,
        max_message_bytes: int,
        replicas: int = 1,
        slow_consumers: SlowConsumers | None = None,
    ) -> None:
        self.connection = connection
        self.js: JetStreamContext = connection.jetstream()
        self.source = source
        self.max_message_bytes = max_message_bytes
        self.replicas = check_replicas(replicas)
        self.slow_consumers = SlowConsumers() if slow_consumers is None else slow_consumers

    @classmethod
    async def connect(
        cls,
        url: str,
        *,
        name: str,
        credentials: str | None = None,
        user: str | None = None,
        password: str | None = None,
        max_message_bytes: int = 1024 * 1024,
        connect_timeout: float = 30.0,
        replicas: int = 1,
    ) -> Bus:
        """Connect (ConnectionError after `connect_timeout`); once up, reconnect for ever.

        `url` may list several servers of one cluster, comma-separated: the client connects
        to any and, when that one is lost, reconnects to another.

        A server that refuses the credentials raises `NatsAuthError` at once: retrying a
        wrong password until the timeout would only hide it. A `user` gets its own inbox
        prefix, which its NATS permissions allow (`permissions.inbox_prefix`).
        """
        slow_consumers = SlowConsumers()
        connection = await open_connection(
            url,
            name=name,
            credentials=credentials,
            user=user,
            password=password,
            timeout=connect_timeout,
            on_permission_violation=PERMISSION_VIOLATIONS.inc,
            on_slow_consumer=slow_consumers.report,
        )
        source = f"tideshift/{name}/{socket.gethostname()}/{os.getpid()}"
        return cls(
            connection,
            source=source,
            max_message_bytes=max_message_bytes,
            replicas=replicas,
            slow_consumers=slow_consumers,
        )

    async def close(self) -> None:
        """Drain: finish in-flight handlers and flush pending publishes, then disconnect."""
        if not self.connection.is_closed:
            with contextlib.suppress(nats.errors.Error, asyncio.TimeoutError):
                await self.connection.drain()

    @property
    def connected(self) -> bool:
        return bool(self.connection.is_connected)

    async def flush(self, timeout: int = 10) -> None:
        """Wait until the server has every message published so far (core NATS included)."""
        await self.connection.flush(timeout=timeout)

    # -- streams -----------------------------------------------------------------------

    async def ensure_streams(self, streams: tuple[StreamSpec, ...] = STREAMS) -> None:
        """Create or update every stream; safe to call from every service at start.
        ReplicasUnavailable when the server cannot keep `replicas` copies."""
        for spec in streams:
            try:
                await self._add_or_update(spec.config(replicas=self.replicas))
            except nats.js.errors.APIError as error:
                failure = placement_failure(error, spec.name, self.replicas)
                if failure is None:
                    raise
                raise failure from None

    async def _add_or_update(self, config: StreamConfig) -> None:
        try:
            await self.js.add_stream(config)
        except nats.js.errors.BadRequestError as error:
            if error.err_code != STREAM_NAME_IN_USE:
                raise
            # Never fewer copies than the stream has: a service started without the
            # cluster's replica setting must not take a cluster's redundancy away.
            existing = await self.js.stream_info(str(config.name))
            config.num_replicas = max(existing.config.num_replicas or 1, self.replicas)
            await self.js.update_stream(config)

    # -- publish -----------------------------------------------------------------------

    def _encode(self, subject: BoundSubject[T], data: T) -> bytes:
        return encode_event(subject, data, source=self.source)

    async def publish(self, subject: BoundSubject[T], data: T) -> None:
        """Fire-and-forget on core NATS (telemetry). A subject kept by a JetStream stream
        raises: published this way it would go unconfirmed (use `publish_durable`)."""
        check_core(subject)
        await self.connection.publish(subject.value, self._encode(subject, data))
        PUBLISHED.labels(subject.subject.pattern.split(".")[2]).inc()

    async def publish_durable(
        self, subject: BoundSubject[T], data: T, *, msg_id: str | None = None
    ) -> int:
        """Publish to JetStream and wait for the stream's ack; `msg_id` de-duplicates."""
        check_durable(subject)
        headers = {"Nats-Msg-Id": msg_id} if msg_id else None
        ack = await self.js.publish(subject.value, self._encode(subject, data), headers=headers)
        PUBLISHED.labels(subject.subject.pattern.split(".")[2]).inc()
        return int(ack.seq)

    # -- receive -----------------------------------------------------------------------

    async def _reject(self, consumer: str, subject: str, raw: bytes, error: EventRejected) -> None:
        letter = dead_letter(consumer, subject, raw, error, at=datetime.now(UTC))
        try:
            await self.publish_durable(DEAD_LETTER.at(consumer=consumer), letter)
        except (TimeoutError, nats.errors.Error) as publish_error:
            log.error("could not dead-letter a message from %s: %s", subject, publish_error)
            return
        try:
            await self._count_discard(consumer)
        except Exception as info_error:  # the count is best effort; the letter is written
            log.debug("dead-letter discards not counted: %s", info_error)

    async def _count_discard(self, consumer: str) -> None:
        """The server drops the oldest letters silently at the stream's limits. A letter that
        lands in a stream that has dropped some and is at its message limit, or within one
        largest letter of its byte limit, displaced one, so it is counted here."""
        info = await self.js.stream_info(str(DEAD_LETTER.stream))
        limits, state = info.config, info.state
        max_msgs, max_bytes = limits.max_msgs or -1, limits.max_bytes or -1
        full_count = 0 < max_msgs <= state.messages
        full_bytes = 0 < max_bytes < state.bytes + LARGEST_DEAD_LETTER_BYTES
        if state.first_seq > 1 and (full_count or full_bytes):
            DEAD_LETTER_DISCARDS.labels(consumer).inc()

    def _decode(self, raw: bytes, expected: type[T] | None) -> Envelope[T]:
        return decode(raw, expected, max_bytes=self.max_message_bytes)

    async def subscribe(
        self,
        subject: BoundSubject[T],
        *,
        consumer: str,
        queue: str | None = None,
        buffer: int = 1024,
        on_drop: Callable[[], None] | None = None,
    ) -> AsyncIterator[Envelope[T]]:
        """Valid events on a (wildcard) subject from core NATS, until the caller stops.

        At most `buffer` messages (and the largest events that many can be) wait in memory;
        beyond that NATS marks this subscriber as a slow consumer and drops, which is the
        right trade-off for superseded telemetry: each drop is counted
        (`tideshift_bus_dropped_total{consumer}`) and calls `on_drop`, for a subscriber that
        must repair what it missed.
        """
        inbox: asyncio.Queue[Msg] = asyncio.Queue(maxsize=buffer)

        async def deliver(msg: Msg) -> None:
            await inbox.put(msg)

        subscription = await self.connection.subscribe(
            subject.value,
            queue=queue or "",
            cb=deliver,
            pending_msgs_limit=buffer,
            pending_bytes_limit=buffer * EVENT_BYTES_BUDGET,
        )
        self.slow_consumers.register(subscription, consumer, on_drop, inbox.qsize)
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
            self.slow_consumers.forget(subscription)
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
                except FETCH_AGAIN:
                    await asyncio.sleep(RECONNECT_POLL_SECONDS)
                    continue
                for msg in messages:
                    try:
                        envelope = self._decode(msg.data, subject.model)
                    except EventRejected as error:
                        await self._reject(durable, msg.subject, msg.data, error)
                        # A lost connection leaves it unterminated: it comes back, is
                        # rejected again, and is terminated then.
                        with contextlib.suppress(nats.errors.Error):
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
        raw = await self._raw_kv(bucket, ttl_seconds=ttl_seconds, history=history)
        return TypedKV(raw, js=self.js, bucket=bucket)

    async def _raw_kv(
        self, bucket: str, *, ttl_seconds: float | None = None, history: int = 1
    ) -> KeyValue:
        try:
            return await self.js.key_value(bucket)
        except nats.js.errors.BucketNotFoundError:
            pass
        try:
            return await self.js.create_key_value(
                bucket=bucket, ttl=ttl_seconds, history=history, replicas=self.replicas
            )
        except nats.js.errors.APIError as error:
            failure = placement_failure(error, f"KV_{bucket}", self.replicas)
            if failure is None:
                raise
            raise failure from None

    async def lease(self, name: str, *, holder: str, ttl_seconds: float) -> Lease:
        kv = await self._raw_kv(LEASES_BUCKET)
        return Lease(kv, name, holder, ttl_seconds)

    async def put_object(self, bucket: str, name: str, data: bytes) -> None:
        await objects.put_object(self.js, bucket, name, data, replicas=self.replicas)

    async def get_object(self, bucket: str, name: str) -> bytes | None:
        """The object's bytes, or None when it does not exist."""
        return await objects.get_object(self.js, bucket, name, replicas=self.replicas)

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
        return await rpc.request(self.connection, subject, payload, timeout=timeout)

    async def serve(
        self,
        subject: str,
        handler: Callable[[bytes], Awaitable[bytes]],
        *,
        queue: str | None = None,
    ) -> Callable[[], Awaitable[None]]:
        """Answer requests on `subject` with `handler`; returns a function that stops serving."""
        return await rpc.serve(self.connection, subject, handler, queue=queue)


def one_line(text: str, limit_bytes: int) -> str:
    """`text` on one line of at most `limit_bytes` UTF-8 bytes: a reason may quote an
    offending value, and a dead letter must not grow with it."""
    flat = " ".join(text.split())
    encoded = flat.encode()
    if len(encoded) <= limit_bytes:
        return flat
    marker = f"... ({len(encoded)} bytes)"
    return encoded[: limit_bytes - len(marker)].decode(errors="ignore") + marker


def encode_event(subject: BoundSubject[T], data: T, *, source: str) -> bytes:
    """The event's wire form; refuses a wildcard subject and a model the subject does not carry."""
    if subject.is_wildcard:
        raise ValueError(f"cannot publish to wildcard subject {subject.value}")
    if not isinstance(data, subject.model):
        raise TypeError(
            f"{subject.subject.pattern} carries {subject.model.__name__}, not {type(data).__name__}"
        )
    return encode(data, source=source, subject=subject.value)


def check_core(subject: BoundSubject[T]) -> None:
    """A subject kept by a JetStream stream published on core NATS would go unconfirmed."""
    if subject.subject.durable:
        raise ValueError(
            f"{subject.subject.pattern} is kept by stream {subject.subject.stream}: "
            "publish it with publish_durable"
        )


def check_durable(subject: BoundSubject[T]) -> None:
    if not subject.subject.durable:
        raise ValueError(f"{subject.subject.pattern} is core NATS: publish it with publish")


def dead_letter(
    consumer: str, subject: str, raw: bytes, error: EventRejected, *, at: datetime
) -> DeadLetter:
    """The letter a rejected message becomes (counted and logged here)."""
    REJECTED.labels(consumer, error.kind).inc()
    reason = one_line(error.reason, DEAD_LETTER_REASON_BYTES)
    log.warning("%s rejected a message on %s: %s", consumer, subject, reason)
    return DeadLetter(
        consumer=consumer,
        original_subject=subject,
        reason=reason,
        payload=raw[:DEAD_LETTER_PAYLOAD_CHARS].decode("utf-8", errors="replace"),
        payload_bytes=len(raw),
        received_at=at,
    )
