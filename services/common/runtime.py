"""How every service runs: logging, signals, the bus, health and metrics endpoints.

Every service has one shape: `async def serve(settings, context, *, clock=WALL_CLOCK, ...)`
(the keywords after `clock` are ports a test or the demo replaces), and
`main = service_main(name, SettingsClass, serve)`, which `tideshift run <name>` calls.
`run_service` starts the embedded nats-server when no URL is configured, connects the bus,
serves `/healthz`, `/readyz` and `/metrics`, waits until the streams are provisioned, runs the
service body until SIGTERM or SIGINT, then drains and exits 0.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
import os
import signal
import socket
import sys
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from tideshift.services.common.bus import Bus, NatsAuthError, provision
from tideshift.services.common.bus.streams import ReplicasUnavailable
from tideshift.services.common.embedded_nats import EmbeddedNats, NatsServerError
from tideshift.services.common.settings import ServiceSettings, parse_settings

log = logging.getLogger("tideshift.runtime")
S = TypeVar("S", bound=ServiceSettings)
SHUTDOWN_GRACE_SECONDS = 20.0


class JsonLogFormatter(logging.Formatter):
    """One JSON object per line: easy for people to grep and for log pipelines to parse."""

    def format(self, record: logging.LogRecord) -> str:
        line = {
            "ts": self.formatTime(record, "%Y-%m-%dT%H:%M:%S%z"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        if record.exc_info:
            line["exc"] = self.formatException(record.exc_info)
        return json.dumps(line)


def configure_logging(level: str) -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonLogFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
    logging.getLogger("nats").setLevel(logging.WARNING)
    logging.getLogger("aiohttp.access").setLevel(logging.WARNING)


@dataclass
class ServiceContext:
    """What a service body gets besides its settings: the bus, the stop signal, and what
    /readyz reports. The bus is NATS's in production; service tests give a `MemoryBus`, which
    the watcher, predictor, planner and executor accept (they type it as `BusPort`; the
    trainer's roles still take the NATS `Bus` itself)."""

    name: str
    settings: ServiceSettings
    bus: Bus
    instance: str
    stopping: asyncio.Event = field(default_factory=asyncio.Event)
    ready: asyncio.Event = field(default_factory=asyncio.Event)
    # Each returns why the service cannot do its work right now (empty: nothing wrong);
    # /readyz answers 503 with the reasons while any check has one.
    readiness_checks: list[Callable[[], list[str]]] = field(default_factory=list)
    health_port: int | None = None

    def not_ready_reasons(self) -> list[str]:
        reasons = [] if self.ready.is_set() else ["starting"]
        if not self.bus.connected:
            reasons.append("NATS disconnected")
        for check in self.readiness_checks:
            reasons.extend(check())
        return reasons


async def _start_health_server(context: ServiceContext) -> web.AppRunner | None:
    settings = context.settings
    if settings.health_port < 0:
        return None

    async def healthz(request: web.Request) -> web.Response:
        return web.Response(text="ok\n")

    async def readyz(request: web.Request) -> web.Response:
        reasons = context.not_ready_reasons()
        if not reasons:
            return web.Response(text="ready\n")
        return web.Response(status=503, text=f"not ready: {'; '.join(reasons)}\n")

    async def metrics(request: web.Request) -> web.Response:
        return web.Response(body=generate_latest(), headers={"Content-Type": CONTENT_TYPE_LATEST})

    app = web.Application()
    app.add_routes(
        [web.get("/healthz", healthz), web.get("/readyz", readyz), web.get("/metrics", metrics)]
    )
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, settings.health_host, settings.health_port)
    await site.start()
    sockets = getattr(site._server, "sockets", None)
    if sockets:
        context.health_port = int(sockets[0].getsockname()[1])
    log.info(
        "%s health and metrics on %s:%s", context.name, settings.health_host, context.health_port
    )
    return runner


async def _serve(
    name: str,
    settings: ServiceSettings,
    body: Callable[[ServiceContext], Coroutine[Any, Any, None]],
    password: str | None,
) -> int:
    embedded: EmbeddedNats | None = None
    url = settings.nats_url
    if url is None:
        embedded = EmbeddedNats()
        # On this (the main) thread: the server's parent-death signal follows the thread
        # that started it, and nothing else runs yet for the wait to block.
        embedded.start()
        url = embedded.url
        log.info("no NATS URL configured: started the bundled nats-server at %s", url)
    instance = settings.instance or f"{socket.gethostname()}-{os.getpid()}"
    bus = await Bus.connect(
        url,
        name=f"{name}-{instance}",
        credentials=settings.nats_credentials,
        user=settings.nats_user,
        password=password,
        max_message_bytes=settings.max_message_bytes,
        replicas=settings.nats_replicas,
    )
    context = ServiceContext(name=name, settings=settings, bus=bus, instance=instance)
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, context.stopping.set)
    runner = await _start_health_server(context)
    try:
        # A server without logins has no provisioner: the service creates the streams, as
        # services always did there (the embedded server provisioned itself already).
        if embedded is None and settings.nats_user is None and settings.nats_credentials is None:
            await bus.ensure_streams()
        code = await _run_body(context, body) if await _provisioned(bus, context.stopping) else 0
    finally:
        if runner is not None:
            await runner.cleanup()
        await bus.close()
        if embedded is not None:
            await asyncio.to_thread(embedded.stop)
    return code


async def _provisioned(bus: Bus, stopping: asyncio.Event) -> bool:
    """Wait until the streams exist: the provisioner creates them (a service role may not),
    and the embedded server did as it started. False when told to stop first."""
    waiting = asyncio.create_task(provision.wait_provisioned(bus))
    stop_wait = asyncio.create_task(stopping.wait())
    await asyncio.wait({waiting, stop_wait}, return_when=asyncio.FIRST_COMPLETED)
    stop_wait.cancel()
    if not waiting.done():
        waiting.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await waiting
        return False
    waiting.result()  # NotProvisioned once the wait's time is up
    return True


async def _run_body(
    context: ServiceContext, body: Callable[[ServiceContext], Coroutine[Any, Any, None]]
) -> int:
    """Run the body until it ends or the stop signal; after the signal, let it drain."""
    name = context.name
    task = asyncio.create_task(body(context), name=name)
    stop_wait = asyncio.create_task(context.stopping.wait())
    done, _ = await asyncio.wait({task, stop_wait}, return_when=asyncio.FIRST_COMPLETED)
    if task not in done:
        log.info("%s stopping: draining (up to %.0fs)", name, SHUTDOWN_GRACE_SECONDS)
        try:
            await asyncio.wait_for(asyncio.shield(task), SHUTDOWN_GRACE_SECONDS)
        except TimeoutError:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
    stop_wait.cancel()
    if task.done() and not task.cancelled() and task.exception() is not None:
        log.error("%s failed", name, exc_info=task.exception())
        return 1
    return 0


def run_service(
    name: str,
    settings: ServiceSettings,
    body: Callable[[ServiceContext], Coroutine[Any, Any, None]],
) -> int:
    """Run a service body to completion; the process exit code."""
    configure_logging(settings.log_level)
    try:
        password = settings.nats_secret()
    except ValueError as error:
        print(f"tideshift {name}: {error}", file=sys.stderr)
        return 2
    try:
        return asyncio.run(_serve(name, settings, body, password))
    except (NatsServerError, NatsAuthError, provision.NotProvisioned, ReplicasUnavailable) as error:
        # A refused login cannot succeed by retrying: say so at once.
        print(f"tideshift {name}: {error}", file=sys.stderr)
        return 1
    except OSError as error:
        print(
            f"tideshift {name}: {error} (is the port taken, or NATS unreachable?)", file=sys.stderr
        )
        return 1


def service_main(
    name: str,
    settings_class: type[S],
    serve: Callable[[S, ServiceContext], Coroutine[Any, Any, None]],
) -> Callable[[Sequence[str]], int]:
    """`main(argv)` of `tideshift run <name>`: parse the settings (flags over environment over
    defaults; exits 2 when invalid), then run `serve(settings, context)` on the wall clock."""

    def main(argv: Sequence[str]) -> int:
        settings = parse_settings(settings_class, argv, prog=f"tideshift run {name}")
        return run_service(name, settings, functools.partial(serve, settings))

    main.__doc__ = f"`tideshift run {name}`: parse its settings from `argv` and run it."
    return main
