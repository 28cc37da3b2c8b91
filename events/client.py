"""A small subscription API for users' own reactions to Tideshift events.

    async with await EventClient.connect("nats://127.0.0.1:4222") as client:
        async for event in client.subscribe(SCALE_COMMAND.filter(namespace="shop")):
            print(event.data.target, event.data.desired, event.data.reason)

Messages that are not valid events are skipped (and reported to `on_reject`), never raised
into the user's loop. Services use `tideshift.services.common.bus`, which adds JetStream, acks and
dead-lettering; this module is for scripts that only need to listen.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import ssl
from asyncio import FIRST_COMPLETED
from collections.abc import AsyncGenerator, Callable
from types import TracebackType
from typing import Any, TypeVar, overload
from urllib.parse import urlsplit

import nats
import nats.errors
from nats.aio.client import Client

from tideshift.events import tls
from tideshift.events.codec import DEFAULT_MAX_BYTES, Envelope, EventRejected, decode
from tideshift.events.models import EventData
from tideshift.events.subjects import ROOT, BoundSubject

log = logging.getLogger("tideshift.events")
T = TypeVar("T", bound=EventData)
RejectHandler = Callable[[str, bytes, EventRejected], None]


async def _open(url: str, options: dict[str, Any], timeout: float) -> Client:
    """Connect, reconnecting for ever once connected; ConnectionError after `timeout`, or at
    once with what to set when the TLS handshake fails (retrying cannot fix it). `url` may
    list a cluster's servers, comma-separated: a lost server's clients move to another."""
    servers = [part.strip() for part in url.split(",") if part.strip()]
    # The scheme, host and port only: a URL may carry a password.
    shown = ",".join(f"{w.scheme}://{w.netloc.rpartition('@')[2]}" for w in map(urlsplit, servers))
    refused: asyncio.Future[str] = asyncio.get_running_loop().create_future()

    async def quiet(error: Exception) -> None:
        # nats-py's default prints a traceback per failed attempt; one line is enough.
        if isinstance(error, ssl.SSLError) and not refused.done():
            refused.set_result(tls.handshake_failure(error, shown))
        log.debug("NATS: %s", error)

    connecting = asyncio.ensure_future(
        nats.connect(
            servers, max_reconnect_attempts=-1, reconnect_time_wait=1, error_cb=quiet, **options
        )
    )
    either: set[asyncio.Future[Any]] = {connecting, refused}
    await asyncio.wait(either, timeout=timeout, return_when=FIRST_COMPLETED)
    if not connecting.done():
        connecting.cancel()
    with contextlib.suppress(asyncio.CancelledError, nats.errors.Error, OSError):
        return await connecting
    if refused.done():
        raise tls.TlsHandshakeError(refused.result())
    raise ConnectionError(f"no NATS server answered at {shown} within {timeout:.0f}s")


class EventClient:
    def __init__(self, connection: Client) -> None:
        self._connection = connection

    @classmethod
    async def connect(
        cls,
        url: str,
        *,
        name: str = "tideshift-events-client",
        credentials: str | None = None,
        user: str | None = None,
        password: str | None = None,
        timeout: float = 10.0,
    ) -> EventClient:
        """Connect, reconnecting for ever once connected; ConnectionError if never reached
        or when the TLS handshake fails.

        `credentials` is the path of a NATS .creds file; `user`/`password` the login of a
        server with users (the read-only `reaction` user of Tideshift's bundled NATS), by
        default from TIDESHIFT_NATS_USER and TIDESHIFT_NATS_PASSWORD. TLS (a private CA, a
        client certificate) from TIDESHIFT_NATS_TLS_CA_FILE, _CERT_FILE and _KEY_FILE.
        """

        if user is None and credentials is None:
            # How Tideshift's chart hands a reaction pod its login (the read-only `reaction`).
            user = os.environ.get("TIDESHIFT_NATS_USER") or None
            password = os.environ.get("TIDESHIFT_NATS_PASSWORD") if user else None
        options: dict[str, Any] = {
            "name": name,
            "user_credentials": credentials,
            "user": user,
            "password": password,
        }
        # The same TIDESHIFT_NATS_TLS_* as the services (the chart sets them in reaction pods).
        if (context := tls.context_from_environment()) is not None:
            options["tls"] = context
        connection = await _open(url, options, timeout)
        return cls(connection)

    async def close(self) -> None:
        await self._connection.drain()

    async def __aenter__(self) -> EventClient:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        await self.close()

    @overload
    def subscribe(
        self,
        target: BoundSubject[T],
        *,
        on_reject: RejectHandler | None = None,
        max_bytes: int = DEFAULT_MAX_BYTES,
    ) -> AsyncGenerator[Envelope[T], None]: ...

    @overload
    def subscribe(
        self,
        target: str = ...,
        *,
        on_reject: RejectHandler | None = None,
        max_bytes: int = DEFAULT_MAX_BYTES,
    ) -> AsyncGenerator[Envelope[EventData], None]: ...

    async def subscribe(
        self,
        target: BoundSubject[Any] | str = f"{ROOT}.>",
        *,
        on_reject: RejectHandler | None = None,
        max_bytes: int = DEFAULT_MAX_BYTES,
    ) -> AsyncGenerator[Envelope[Any], None]:
        """Yield every valid event on a subject (wildcards allowed) until cancelled."""
        subject, expected = (
            (target.value, target.model) if isinstance(target, BoundSubject) else (target, None)
        )
        queue: asyncio.Queue[tuple[str, bytes]] = asyncio.Queue(maxsize=1024)

        async def deliver(msg: Any) -> None:
            await queue.put((msg.subject, msg.data))

        subscription = await self._connection.subscribe(subject, cb=deliver)
        try:
            while True:
                received_subject, raw = await queue.get()
                try:
                    yield decode(raw, expected, max_bytes=max_bytes)
                except EventRejected as rejection:
                    if on_reject is not None:
                        on_reject(received_subject, raw, rejection)
        finally:
            # A loop left early closes this generator only when garbage-collected, possibly
            # after the connection started draining, which unsubscribes everything itself.
            if not (self._connection.is_draining or self._connection.is_closed):
                await subscription.unsubscribe()
