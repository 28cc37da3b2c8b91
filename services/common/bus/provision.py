"""Creating Tideshift's streams and buckets: the provisioner's job, not every service's.

Creating or redefining a stream is an admin right: whoever holds it can change a stream's
subjects, limits and retention. So one identity, `provisioner`, creates the JetStream streams
(`streams.STREAMS`) and every key/value and object bucket (`events.buckets`), at install and
upgrade (the chart's provisioning Job, `tideshift nats provision`) or when the embedded server
starts (`EmbeddedNats`, so `tideshift demo` and local runs need no step). Service roles only use
what exists (`permissions.py`): a service started first waits here, saying what it waits for.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys
import time
from collections.abc import Sequence

import nats.errors
import nats.js.errors

from tideshift.services.common.bus import objects
from tideshift.services.common.bus.client import Bus
from tideshift.services.common.bus.connect import redact
from tideshift.services.common.bus.streams import (
    BUCKETS,
    MAX_REPLICAS,
    STREAMS,
    ReplicasUnavailable,
)

log = logging.getLogger("tideshift.bus")

WAIT_POLL_SECONDS = 1.0


class NotProvisioned(RuntimeError):
    """Streams or buckets a service needs are missing after the wait."""


def stream_names() -> list[str]:
    """Every stream provisioning creates: the event streams and the buckets' streams."""
    return [spec.name for spec in STREAMS] + [bucket.stream for bucket in BUCKETS]


async def provision(bus: Bus) -> list[str]:
    """Create (or bring up to date) every stream and create every missing bucket; the names
    of the streams that exist afterwards. Idempotent: run it at every install and upgrade."""
    # Buckets first: once the event streams exist, every bucket does (`wait_provisioned`).
    for bucket in BUCKETS:
        if bucket.objects:
            await objects.object_store(bus.js, bucket.name, replicas=bus.replicas)
        else:
            await bus.kv(bucket.name, ttl_seconds=bucket.ttl_seconds)
    await bus.ensure_streams()
    return stream_names()


async def missing(bus: Bus, names: Sequence[str]) -> list[str]:
    """The streams of `names` the server does not have."""
    absent = []
    for name in names:
        try:
            await bus.js.stream_info(name)
        except nats.js.errors.NotFoundError:
            absent.append(name)
    return absent


def _missing_line(absent: Sequence[str]) -> str:
    return (
        f"streams {', '.join(absent)} missing: run `tideshift nats provision` as the "
        "provisioner (the chart's provisioning Job)"
    )


def _event_streams(names: Sequence[str] | None) -> list[str]:
    # The event streams by default: every service role may look them up, and provisioning
    # creates them last, so once they exist every bucket does too.
    return list(names) if names is not None else [spec.name for spec in STREAMS]


async def check_provisioned(bus: Bus, names: Sequence[str] | None = None) -> None:
    """NotProvisioned at once, naming what is missing, unless every stream of `names`
    exists (a command-line tool fails rather than waits)."""
    if absent := await missing(bus, _event_streams(names)):
        raise NotProvisioned(_missing_line(absent))


async def wait_provisioned(
    bus: Bus, names: Sequence[str] | None = None, *, timeout: float = 300.0
) -> None:
    """Return once every stream of `names` exists (default: the event streams); until then
    say every few seconds what is missing and who creates it. NotProvisioned after
    `timeout`."""
    wanted = _event_streams(names)
    deadline = time.monotonic() + timeout
    said: float | None = None
    while absent := await missing(bus, wanted):
        now = time.monotonic()
        if now >= deadline:
            raise NotProvisioned(f"after {timeout:.0f}s, {_missing_line(absent)}")
        if said is None or now - said >= 10 * WAIT_POLL_SECONDS:
            log.warning(
                "waiting for streams %s: `tideshift nats provision` as the provisioner (the "
                "chart's provisioning Job) creates them",
                ", ".join(absent),
            )
            said = now
        await asyncio.sleep(WAIT_POLL_SECONDS)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="tideshift nats provision",
        description=(
            "Create Tideshift's JetStream streams and key/value and object buckets (idempotent). "
            "Log in as the provisioner: TIDESHIFT_NATS_USER=provisioner with "
            "TIDESHIFT_NATS_PASSWORD or TIDESHIFT_NATS_PASSWORD_FILE; TLS from "
            "TIDESHIFT_NATS_TLS_CA_FILE (and _CERT_FILE/_KEY_FILE). With --wait, any service's "
            "login only waits until it is done (the chart's init container of each service)."
        ),
    )
    parser.add_argument(
        "--nats-url",
        default=os.environ.get("TIDESHIFT_NATS_URL"),
        help=(
            "NATS server URL (nats://host:4222 or tls://...), or a cluster's several, "
            "comma-separated; default $TIDESHIFT_NATS_URL"
        ),
    )
    parser.add_argument(
        "--nats-replicas",
        default=os.environ.get("TIDESHIFT_NATS_REPLICAS", "1"),
        help=(
            f"servers of a NATS cluster that keep each stream and bucket, 1 to {MAX_REPLICAS} "
            "(3 in a three-server cluster); default $TIDESHIFT_NATS_REPLICAS or 1"
        ),
    )
    parser.add_argument(
        "--timeout",
        type=float,
        default=60.0,
        help="seconds to wait for the server to answer (default 60)",
    )
    parser.add_argument(
        "--wait",
        action="store_true",
        help="create nothing: wait (up to 300 s) until the streams exist, saying what is missing",
    )
    return parser


async def _wait_at(url: str, *, timeout: float, replicas: int) -> list[str]:
    bus = await Bus.connect(url, name="tideshift-provision-wait", connect_timeout=timeout)
    try:
        await wait_provisioned(bus)
        return [spec.name for spec in STREAMS]
    finally:
        await bus.close()


async def provision_at(
    url: str,
    *,
    user: str | None = None,
    password: str | None = None,
    timeout: float = 60.0,
    replicas: int = 1,
) -> list[str]:
    """Connect (as `user`, else the environment's login), provision with `replicas` copies
    of each stream, disconnect."""
    bus = await Bus.connect(
        url,
        name="tideshift-provision",
        user=user,
        password=password,
        connect_timeout=timeout,
        replicas=replicas,
    )
    try:
        return await provision(bus)
    finally:
        await bus.close()


def _replicas(text: str) -> int:
    if not text.isdigit() or not 1 <= int(text) <= MAX_REPLICAS:
        _parser().error(
            f"--nats-replicas (TIDESHIFT_NATS_REPLICAS) {text!r}: expected a whole number "
            f"from 1 to {MAX_REPLICAS}"
        )
    return int(text)


def main(argv: Sequence[str]) -> int:
    """`tideshift nats provision`: 0 once everything exists, 1 with one line when it cannot."""
    args = _parser().parse_args(argv)
    if not args.nats_url:
        _parser().error("--nats-url: expected a NATS URL (or set TIDESHIFT_NATS_URL)")
    if not 0 < args.timeout <= 3600:
        _parser().error("--timeout: expected seconds between 0 and 3600")
    replicas = _replicas(args.nats_replicas)
    work = _wait_at if args.wait else provision_at
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    try:
        found = asyncio.run(work(args.nats_url, timeout=args.timeout, replicas=replicas))
    except (
        ConnectionError,
        TimeoutError,
        NotProvisioned,
        ReplicasUnavailable,
        nats.errors.Error,
    ) as error:
        reason = " ".join(str(error).split()) or type(error).__name__
        print(f"tideshift nats provision: {redact(args.nats_url)}: {reason}", file=sys.stderr)
        return 1
    print(f"{'found' if args.wait else 'provisioned'} {len(found)} streams: {', '.join(found)}")
    return 0
