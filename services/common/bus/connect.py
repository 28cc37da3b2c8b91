"""Opening the NATS connection: credentials, TLS, a per-user inbox, and failing fast when refused.

nats-py retries a refused login like an unreachable server until the timeout, reporting the
`Authorization Violation` only to its error callback; here that ends the attempt at once with
`NatsAuthError`, and a TLS handshake that fails (an unknown CA, a missing client certificate)
with `NatsTlsError`. No message carries the password of a `nats://user:password@host` URL.

TLS is set in one place for every client (services, the CLIs, the trainer SDK, the users'
`EventClient`): the TIDESHIFT_NATS_TLS_* environment variables of `events.tls`, which the
chart sets from its values.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import ssl
import urllib.parse
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, NoReturn

import nats
import nats.errors
from nats.aio.client import Client

from tideshift.events import tls
from tideshift.events.tls import TLS_CA_VARIABLE, TLS_CERT_VARIABLE, TLS_KEY_VARIABLE
from tideshift.services.common.bus.permissions import inbox_prefix

log = logging.getLogger("tideshift.bus")


__all__ = [
    "TLS_CA_VARIABLE",
    "TLS_CERT_VARIABLE",
    "TLS_KEY_VARIABLE",
    "NatsAuthError",
    "NatsTlsError",
    "login_from_environment",
    "open_connection",
    "redact",
    "server_list",
    "tls_from_environment",
]


class NatsAuthError(ConnectionError):
    """The NATS server refused this client's credentials (or the lack of them)."""


class NatsTlsError(NatsAuthError):
    """The TLS handshake failed: the server's certificate is not trusted, or the server wants
    a client certificate this client does not have. Retrying cannot fix either."""


def server_list(url: str) -> list[str]:
    """The servers of `url`: one URL, or a cluster's several separated by commas."""
    servers = [part.strip() for part in url.split(",") if part.strip()]
    if not servers:
        raise ConnectionError(f"TIDESHIFT_NATS_URL {url!r}: expected nats://host:port[,...]")
    return servers


def redact(url: str) -> str:
    """`url` (one or a comma-separated list) without a password it may carry
    (`nats://user:secret@host`), for messages."""
    if "," in url:
        return ",".join(redact(part) for part in server_list(url))
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


def tls_from_environment() -> ssl.SSLContext | None:
    """The TLS context TIDESHIFT_NATS_TLS_* describe (`events.tls`), or None when none is set."""
    try:
        return tls.context_from_environment()
    except tls.TlsSettingError as error:
        raise NatsTlsError(str(error)) from None


async def _give_up(
    connecting: asyncio.Future[Client],
    refused: asyncio.Future[ConnectionError],
    shown: str,
    timeout: float,
) -> NoReturn:
    connecting.cancel()
    with contextlib.suppress(asyncio.CancelledError, nats.errors.Error, OSError):
        await connecting
    if refused.done():
        raise refused.result()
    raise ConnectionError(f"no NATS server answered at {shown} within {timeout:.0f}s")


def _why(violation: str) -> str:
    """What a refused creation most likely means: only the provisioner creates streams and
    buckets, so one missing is a provisioning step not run (or an older one)."""
    if "$js.api.stream.create." not in violation.lower():
        return ""
    return (
        " (streams and buckets are created by `tideshift nats provision` as the provisioner, "
        "the chart's provisioning Job: has it run for this version?)"
    )


def _refusal(error: Exception, shown: str, user: str | None) -> NatsAuthError | None:
    """The error to fail at once with, when `error` says retrying cannot help."""
    if isinstance(error, ssl.SSLError):
        return NatsTlsError(tls.handshake_failure(error, shown))
    if "authorization violation" not in str(error).lower():
        return None
    who = f"user {user!r}" if user else "an anonymous client"
    return NatsAuthError(
        f"NATS at {shown} refused {who}: {error} (check the NATS user and "
        "password: TIDESHIFT_NATS_USER, TIDESHIFT_NATS_PASSWORD or "
        "TIDESHIFT_NATS_PASSWORD_FILE)"
    )


def _login_options(
    credentials: str | None, user: str | None, password: str | None, tls: ssl.SSLContext | None
) -> dict[str, Any]:
    options: dict[str, Any] = {"user_credentials": credentials}
    if tls is not None:
        options["tls"] = tls
    if user is not None:
        options |= {"user": user, "password": password, "inbox_prefix": inbox_prefix(user)}
    return options


def _error_callback(
    name: str,
    shown: str,
    user: str | None,
    *,
    refused: asyncio.Future[ConnectionError],
    on_permission_violation: Callable[[], None],
    on_slow_consumer: Callable[[nats.errors.SlowConsumerError], None],
) -> Callable[[Exception], Awaitable[None]]:
    """What the connection does with an asynchronous error: a refusal fails the connect at
    once, a permission violation is counted, a slow consumer is its subscriber's business."""

    async def on_error(error: Exception) -> None:
        if isinstance(error, nats.errors.SlowConsumerError):
            on_slow_consumer(error)  # counted and logged there, not once per message here
            return
        text = str(error)
        failure = _refusal(error, shown, user)
        if failure is not None and not refused.done():
            refused.set_result(failure)
        if "permissions violation" in text.lower():
            on_permission_violation()
            log.error("NATS refused an operation of %s: %s%s", name, text, _why(text))
            return
        log.warning("NATS error: %s", text)

    return on_error


async def open_connection(
    url: str,
    *,
    name: str,
    credentials: str | None,
    user: str | None,
    password: str | None,
    timeout: float,
    on_permission_violation: Callable[[], None],
    on_slow_consumer: Callable[[nats.errors.SlowConsumerError], None],
) -> Client:
    """Connect (ConnectionError after `timeout`, NatsAuthError or NatsTlsError at once when
    refused); once up, the connection reconnects for ever."""
    shown = redact(url)
    if user is None and credentials is None:
        user, password = login_from_environment()
    refused: asyncio.Future[ConnectionError] = asyncio.get_running_loop().create_future()

    async def on_disconnect() -> None:
        up = connecting.done() and not connecting.cancelled() and not connecting.exception()
        if up and (connecting.result().is_closed or connecting.result().is_draining):
            return  # our own close(): nothing went wrong, so nothing to warn about
        log.warning("disconnected from NATS %s; reconnecting", shown)

    async def on_reconnect() -> None:
        log.info("reconnected to NATS %s", shown)

    on_error = _error_callback(
        name,
        shown,
        user,
        refused=refused,
        on_permission_violation=on_permission_violation,
        on_slow_consumer=on_slow_consumer,
    )
    options = _login_options(credentials, user, password, tls_from_environment())
    connecting = asyncio.ensure_future(
        nats.connect(
            server_list(url),
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
        await _give_up(connecting, refused, shown, timeout)
    try:
        return connecting.result()
    except (nats.errors.NoServersError, nats.errors.Error, OSError) as error:
        raise ConnectionError(f"no NATS server answered at {shown}: {error}") from None
