"""Raw request/reply: binary payloads between trainers and parameter servers (no events)."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Awaitable, Callable

import nats.errors
from nats.aio.client import Client
from nats.aio.msg import Msg

log = logging.getLogger("tideshift.bus")


class RequestFailed(RuntimeError):
    """A request got no usable answer: timeout, no responder, or a lost connection."""


async def request(connection: Client, subject: str, payload: bytes, *, timeout: float) -> bytes:
    """Send a request and return the reply; RequestFailed when none comes."""
    try:
        reply = await connection.request(subject, payload, timeout=timeout)
    except (nats.errors.Error, TimeoutError) as error:
        raise RequestFailed(f"{subject}: {type(error).__name__}: {error}") from error
    data: bytes = reply.data
    return data


async def serve(
    connection: Client,
    subject: str,
    handler: Callable[[bytes], Awaitable[bytes]],
    *,
    queue: str | None = None,
) -> Callable[[], Awaitable[None]]:
    """Answer requests on `subject` with `handler`; returns a function that stops serving.

    A handler that raises answers with an `error: ...` payload instead of leaving the
    requester to time out.
    """

    async def respond(msg: Msg) -> None:
        response = await answer(handler, msg.subject, msg.data)
        if msg.reply:
            await msg.respond(response)

    subscription = await connection.subscribe(subject, queue=queue or "", cb=respond)

    async def stop() -> None:
        with contextlib.suppress(nats.errors.Error):
            await subscription.unsubscribe()

    return stop


async def answer(
    handler: Callable[[bytes], Awaitable[bytes]], subject: str, payload: bytes
) -> bytes:
    """The handler's reply, or `error: ...` when it raised (one bad request must not stop the
    server, nor leave the requester to time out)."""
    try:
        return await handler(payload)
    except Exception as error:
        log.warning("request on %s failed: %s", subject, error)
        return f"error: {error}".encode()
