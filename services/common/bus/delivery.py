"""One JetStream delivery as a service sees it: the decoded event and how to settle it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar

from tideshift.events import Envelope, EventData

T = TypeVar("T", bound=EventData)


class _Metadata(Protocol):
    @property
    def num_delivered(self) -> int | None: ...


class Settle(Protocol):
    """How a delivery is settled: a JetStream `Msg`, or the in-memory bus's stand-in."""

    @property
    def metadata(self) -> _Metadata: ...

    async def ack_sync(self, timeout: float = 1.0) -> object: ...

    async def nak(self, delay: float | None = None) -> None: ...

    async def in_progress(self) -> None: ...

    async def term(self) -> None: ...


@dataclass
class Delivery(Generic[T]):
    """One JetStream message: the decoded event plus its acknowledgement controls."""

    event: Envelope[T]
    _msg: Settle

    @property
    def num_delivered(self) -> int:
        return int(self._msg.metadata.num_delivered or 0)

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
