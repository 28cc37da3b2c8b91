"""The bus port: what the services ask of the bus, whichever implements it.

`Bus` (client.py) is the NATS implementation every `tideshift run <service>` uses;
`MemoryBus` (memory.py) keeps the same semantics in one process, on an injected `Clock`, for
tests of service logic that need no nats-server. A service types its bus as `BusPort`.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Protocol, TypeVar

from tideshift.events import BoundSubject, Envelope, EventData
from tideshift.services.common.bus.delivery import Delivery
from tideshift.services.common.bus.drops import SlowConsumers
from tideshift.services.common.bus.kv import Lease, TypedKV
from tideshift.services.common.bus.streams import STREAMS, StreamSpec

T = TypeVar("T", bound=EventData)


class BusPort(Protocol):
    """Publish (core or durable), subscribe (core, at most once), consume (a durable consumer:
    ack, nak with a delay, redelivery after `ack_wait_seconds`, no more after `max_deliver`),
    typed KV with revisions and compare-and-set, leases, objects and raw request/reply."""

    source: str
    max_message_bytes: int
    slow_consumers: SlowConsumers

    @property
    def connected(self) -> bool: ...

    async def close(self) -> None: ...

    async def flush(self, timeout: int = 10) -> None: ...

    async def ensure_streams(self, streams: tuple[StreamSpec, ...] = STREAMS) -> None: ...

    async def publish(self, subject: BoundSubject[T], data: T) -> None: ...

    async def publish_durable(
        self, subject: BoundSubject[T], data: T, *, msg_id: str | None = None
    ) -> int: ...

    def subscribe(
        self,
        subject: BoundSubject[T],
        *,
        consumer: str,
        queue: str | None = None,
        buffer: int = 1024,
        on_drop: Callable[[], None] | None = None,
    ) -> AsyncIterator[Envelope[T]]: ...

    def consume(
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
    ) -> AsyncIterator[Delivery[T]]: ...

    async def kv(
        self, bucket: str, *, ttl_seconds: float | None = None, history: int = 1
    ) -> TypedKV: ...

    async def lease(self, name: str, *, holder: str, ttl_seconds: float) -> Lease: ...

    async def put_object(self, bucket: str, name: str, data: bytes) -> None: ...

    async def get_object(self, bucket: str, name: str) -> bytes | None: ...

    async def queued(self, subject: BoundSubject[T], *, stream: StreamSpec) -> int: ...

    async def delete_consumer(self, stream: StreamSpec, durable: str) -> None: ...

    async def request(self, subject: str, payload: bytes, *, timeout: float = 5.0) -> bytes: ...

    async def serve(
        self,
        subject: str,
        handler: Callable[[bytes], Awaitable[bytes]],
        *,
        queue: str | None = None,
    ) -> Callable[[], Awaitable[None]]: ...
