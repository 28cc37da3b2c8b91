"""Opening the NATS connection: credentials, a per-user inbox, and failing fast when refused.

nats-py retries a refused login like an unreachable server until the timeout, reporting the
`Authorization Violation` only to its error callback; here that ends the attempt at once with
`NatsAuthError`. No message carries the password of a `nats://user:password@host` URL.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import urllib.parse
from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn

import nats
import nats.errors
from nats.aio.client import Client

from tideshift.services.common.bus.permissions import inbox_prefix

log = logging.getLogger("tideshift.bus")


class NatsAuthError(ConnectionError):
    """The NATS server refused this client's credentials (or the lack of them)."""


def redact(url: str) -> str:
    """`url` without a password it may carry (`nats://user:secret@host`), for messages."""
    parts = urllib.parse.urlsplit(url)
    if parts.password is None:
        return url
    netloc = f"{parts.username}:***@{parts.hostname}" + (f":{parts.port}" if parts.port else "")
    return urllib.parse.urlunsplit(parts._replace(netloc=netloc))


def login_from_environment() -> tuple[str | None, str | None]:
    """TIDESHIFT_NATS_USER with TIDESHIFT_NATS_PASSWORD or _FILE: how the chart hands a pod
    its role's login, so every client (the trainer SDK, the CLIs) logs in the same way."""
    user = os.environ.get("TIDESHIFT_NATS_USER") or None
    password = os.environ.get("TIDESHIFT_NATS_PASSWORD")
    path = os.environ.get("TIDESHIFT_NATS_PASSWORD_FILE")
    if user is not None and password is None and path:
        try:
            password = Path(path).read_text().strip()
        except (OSError, UnicodeDecodeError) as error:
            raise ConnectionError(f"TIDESHIFT_NATS_PASSWORD_FILE {path}: {error}") from None
    return user, password


async def _give_up(
    connecting: asyncio.Future[Client],
    refused: asyncio.Future[str],
    shown: str,
    timeout: float,
    user: str | None,
) -> NoReturn:
    connecting.cancel()
    with contextlib.suppress(asyncio.CancelledError, nats.errors.Error, OSError):
        await connecting
    if refused.done():
        who = f"user {user!r}" if user else "an anonymous client"
        raise NatsAuthError(
            f"NATS at {shown} refused {who}: {refused.result()} (check the NATS user and "
            "password: TIDESHIFT_NATS_USER, TIDESHIFT_NATS_PASSWORD or "
            "TIDESHIFT_NATS_PASSWORD_FILE)"
        )
    raise ConnectionError(f"no NATS server answered at {shown} within {timeout:.0f}s")


async def open_connection(
    url: str,
    *,
    name: str,
    credentials: str | None,
    user: str | None,
    password: str | None,
    timeout: float,
    on_permission_violation: Callable[[], None],
) -> Client:
    """Connect (ConnectionError after `timeout`, NatsAuthError at once when refused); once
    up, the connection reconnects for ever."""
    shown = redact(url)
    if user is None and credentials is None:
        user, password = login_from_environment()
    refused: asyncio.Future[str] = asyncio.get_running_loop().create_future()

    async def on_disconnect() -> None:
        up = connecting.done() and not connecting.cancelled() and not connecting.exception()
        if up and (connecting.result().is_closed or connecting.result().is_draining):
            return  # our own close(): nothing went wrong, so nothing to warn about
        log.warning("disconnected from NATS %s; reconnecting", shown)

    async def on_reconnect() -> None:
        log.info("reconnected to NATS %s", shown)

    async def on_error(error: Exception) -> None:
        text = str(error)
        if "authorization violation" in text.lower() and not refused.done():
            refused.set_result(text)
        if "permissions violation" in text.lower():
            on_permission_violation()
            log.error("NATS refused an operation of %s: %s", name, text)
            return
        log.warning("NATS error: %s", text)

    options: dict[str, Any] = {"user_credentials": credentials}
    if user is not None:
        options |= {"user": user, "password": password, "inbox_prefix": inbox_prefix(user)}
    connecting = asyncio.ensure_future(
        nats.connect(
            url,
            name=name,
            max_reconnect_attempts=-1,
            reconnect_time_wait=0.5,
            allow_reconnect=True,
            disconnected_cb=on_disconnect,
            reconnected_cb=on_reconnect,
            error_cb=on_error,
            **options,
        )
    )
    waiting: set[asyncio.Future[Any]] = {connecting, refused}
    done, _ = await asyncio.wait(waiting, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
    if connecting not in done:
        await _give_up(connecting, refused, shown, timeout, user)
    try:
        return connecting.result()
    except (nats.errors.NoServersError, nats.errors.Error, OSError) as error:
        raise ConnectionError(f"no NATS server answered at {shown}: {error}") from None
