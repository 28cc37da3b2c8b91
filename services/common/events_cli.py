"""`tideshift events tail|schema`: watch the bus, or print the contract as AsyncAPI."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import sys
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlparse

from tideshift.events import Envelope, EventData, EventRejected, decode, mqtt_topic_filter, tls
from tideshift.events.asyncapi import asyncapi_document
from tideshift.events.client import EventClient
from tideshift.events.subjects import ROOT
from tideshift.services.common.bus.connect import redact

DEFAULT_NATS_URL = "nats://127.0.0.1:4222"
DEFAULT_MQTT_URL = "mqtt://127.0.0.1:1883"


def _report_rejection(subject: str, raw: bytes, error: EventRejected) -> None:
    print(f"# skipped a message on {subject}: {error.reason}", file=sys.stderr, flush=True)


def _url_problem(flag: str, url: str, schemes: set[str]) -> str | None:
    """Why `url` is not a server address (one line), or None."""
    parsed = urlparse(url)
    try:
        port_ok = parsed.port is None or parsed.port > 0
    except ValueError:
        port_ok = False
    if parsed.scheme in schemes and parsed.hostname and port_ok:
        return None
    expected = f"{sorted(schemes)[0]}://host:port (scheme one of {', '.join(sorted(schemes))})"
    return f"invalid {flag} {redact(url)!r}: expected {expected}"


async def _tail_nats(url: str, pattern: str, limit: int | None, login: _Login) -> None:
    seen = 0
    async with (
        await EventClient.connect(
            url, name="tideshift-events-tail", user=login.user, password=login.password
        ) as client,
        contextlib.aclosing(client.subscribe(pattern, on_reject=_report_rejection)) as stream,
    ):
        # closed on return, so the subscription ends before the connection drains
        async for event in stream:
            print(event.to_json(), flush=True)
            seen += 1
            if limit is not None and seen >= limit:
                return


async def _tail_mqtt(url: str, pattern: str, limit: int | None, login: _Login) -> None:
    import aiomqtt

    parsed = urlparse(url)
    client = aiomqtt.Client(
        parsed.hostname or "127.0.0.1",
        port=parsed.port or 1883,
        identifier=f"tail-{os.getpid()}",
        username=login.user,
        password=login.password,
        # the same TIDESHIFT_NATS_TLS_* as NATS: the chart's listener serves MQTT over TLS too
        tls_context=tls.context_from_environment(),
    )
    try:
        async with client:
            await client.subscribe(mqtt_topic_filter(pattern), qos=0)
            await _print_mqtt(client.messages, limit)
    except aiomqtt.MqttError as error:  # a refused or lost connection, as NATS's are OSErrors
        raise ConnectionError(str(error)) from None


async def _print_mqtt(messages: AsyncIterator[Any], limit: int | None) -> None:
    seen = 0
    async for message in messages:
        payload = message.payload if isinstance(message.payload, bytes) else b""
        try:
            event: Envelope[EventData] = decode(payload)
        except EventRejected as error:
            _report_rejection(str(message.topic), payload, error)
            continue
        print(event.to_json(), flush=True)
        seen += 1
        if limit is not None and seen >= limit:
            return


@dataclass(frozen=True)
class _Login:
    """A NATS/MQTT user of a server with authentication (`tideshift nats --auth`)."""

    user: str | None
    password: str | None


def main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(prog="tideshift events", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    tail = commands.add_parser("tail", help="print one CloudEvent JSON per line")
    tail.add_argument(
        "pattern",
        nargs="?",
        default=f"{ROOT}.>",
        help=f"NATS subject pattern (default {ROOT}.>), e.g. {ROOT}.scale.>",
    )
    tail.add_argument("--mqtt", action="store_true", help="receive through the MQTT listener")
    tail.add_argument("--nats-url", default=os.environ.get("TIDESHIFT_NATS_URL", DEFAULT_NATS_URL))
    tail.add_argument("--mqtt-url", default=os.environ.get("TIDESHIFT_MQTT_URL", DEFAULT_MQTT_URL))
    tail.add_argument("--count", type=int, default=None, help="exit after this many events")
    tail.add_argument(
        "--nats-user",
        default=os.environ.get("TIDESHIFT_NATS_USER"),
        help="login of a server with users, e.g. reaction (the password from "
        "TIDESHIFT_NATS_PASSWORD, never a flag)",
    )
    commands.add_parser("schema", help="print the AsyncAPI 3.0 document of every event")
    args = parser.parse_args(argv)

    if args.command == "schema":
        print(json.dumps(asyncapi_document(), indent=2))
        return 0
    if args.count is not None and args.count <= 0:
        parser.error("--count must be a positive number of events")
    if not args.pattern.startswith(ROOT.split(".")[0]):
        parser.error(f"pattern must be a Tideshift subject such as {ROOT}.>, got {args.pattern!r}")
    problem = (
        _url_problem("--mqtt-url", args.mqtt_url, {"mqtt", "tcp"})
        if args.mqtt
        else _url_problem("--nats-url", args.nats_url, {"nats", "tls", "ws", "wss"})
    )
    if problem:
        print(f"tideshift events tail: {problem}", file=sys.stderr)
        return 2
    login = _Login(args.nats_user, os.environ.get("TIDESHIFT_NATS_PASSWORD"))
    try:
        if args.mqtt:
            asyncio.run(_tail_mqtt(args.mqtt_url, args.pattern, args.count, login))
        else:
            asyncio.run(_tail_nats(args.nats_url, args.pattern, args.count, login))
    except KeyboardInterrupt:
        return 0
    except (tls.TlsSettingError, tls.TlsHandshakeError) as error:
        # already names the variable to set; starting a server would not help
        print(f"tideshift events tail: {error}", file=sys.stderr)
        return 1
    except OSError as error:
        url = redact(args.mqtt_url if args.mqtt else args.nats_url)
        print(
            f"tideshift events tail: cannot reach {url}: {error}. Start a server with "
            "`tideshift nats` or pass --nats-url/--mqtt-url.",
            file=sys.stderr,
        )
        return 1
    return 0
