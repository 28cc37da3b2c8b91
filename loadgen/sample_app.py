"""`tideshift serve-sample`: a serving replica with a fixed capacity, and its Prometheus metrics.

Each request occupies one of `workers` slots for `service_time_s`, so one replica serves
`capacity_rps = workers / service_time_s` requests per second (Little's law). A request that
cannot get a slot within `latency_target_s - service_time_s` is shed with 503 instead of
queueing without bound: beyond its capacity a replica answers fast failures, not slow successes,
which is how a capacity shortfall shows up in the metrics (`code="503"`).

Metrics (the predictor's default query is `sum(rate(http_requests_total{app="<app>"}[1m]))`):
* `http_requests_total{app, code}`: requests answered on `/`, by status code.
* `http_request_duration_seconds{app}`: latency histogram of those requests.
* `sample_app_capacity_rps{app}`, `sample_app_in_flight{app}`: the replica's configured capacity
  and its current load.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import math
import signal
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass

from aiohttp import web
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)

REQUESTS_METRIC = "http_requests_total"
LATENCY_METRIC = "http_request_duration_seconds"
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)

log = logging.getLogger("tideshift.sample_app")


@dataclass(frozen=True)
class SampleAppConfig:
    app: str = "web"
    capacity_rps: float = 50.0  # requests/s one replica serves within its latency target
    service_time_s: float = 0.02  # time one request holds a worker
    latency_target_s: float = 0.25  # a request that would wait longer than this is shed

    def __post_init__(self) -> None:
        if not self.capacity_rps > 0:
            raise ValueError(f"--capacity-rps must be > 0, got {self.capacity_rps}")
        if not self.service_time_s > 0:
            raise ValueError(f"--service-time-s must be > 0, got {self.service_time_s}")
        if not self.latency_target_s > self.service_time_s:
            raise ValueError(
                f"--latency-target-s ({self.latency_target_s}) must exceed "
                f"--service-time-s ({self.service_time_s})"
            )

    @property
    def workers(self) -> int:
        return max(1, math.ceil(self.capacity_rps * self.service_time_s))

    @property
    def effective_service_time_s(self) -> float:
        """Rounding workers up would raise capacity: stretch the service time to compensate."""
        return self.workers / self.capacity_rps


class SampleApp:
    """The app and its own metrics registry (several can live in one process, e.g. in tests)."""

    def __init__(self, config: SampleAppConfig) -> None:
        self.config = config
        self.registry = CollectorRegistry()
        self.requests = Counter(
            "http_requests",
            "HTTP requests answered by the sample app, by status code",
            ["app", "code"],
            registry=self.registry,
        )
        self.latency = Histogram(
            LATENCY_METRIC,
            "Latency of requests answered by the sample app",
            ["app"],
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        capacity = Gauge(
            "sample_app_capacity_rps",
            "Requests per second one replica serves within its latency target",
            ["app"],
            registry=self.registry,
        )
        capacity.labels(config.app).set(config.capacity_rps)
        self.in_flight = Gauge(
            "sample_app_in_flight",
            "Requests being served or waiting",
            ["app"],
            registry=self.registry,
        )
        # Pre-create the label sets the predictor queries so a fresh replica reports zeros.
        self.requests.labels(config.app, "200")
        self.requests.labels(config.app, "503")
        self._slots = asyncio.Semaphore(config.workers)

    async def handle(self, request: web.Request) -> web.Response:
        config = self.config
        started = time.perf_counter()
        gauge = self.in_flight.labels(config.app)
        gauge.inc()
        try:
            try:
                await asyncio.wait_for(
                    self._slots.acquire(), config.latency_target_s - config.service_time_s
                )
            except TimeoutError:
                status = 503
                response = web.Response(status=status, text="over capacity\n")
            else:
                try:
                    await asyncio.sleep(config.effective_service_time_s)
                finally:
                    self._slots.release()
                status = 200
                response = web.Response(text="ok\n")
        finally:
            gauge.dec()
        self.requests.labels(config.app, str(status)).inc()
        self.latency.labels(config.app).observe(time.perf_counter() - started)
        return response

    async def metrics(self, request: web.Request) -> web.Response:
        return web.Response(
            body=generate_latest(self.registry), headers={"Content-Type": CONTENT_TYPE_LATEST}
        )

    async def healthz(self, request: web.Request) -> web.Response:
        return web.Response(text="ok\n")

    def application(self) -> web.Application:
        app = web.Application()
        app.add_routes(
            [
                web.get("/", self.handle),
                web.post("/", self.handle),
                web.get("/healthz", self.healthz),
                web.get("/readyz", self.healthz),
                web.get("/metrics", self.metrics),
            ]
        )
        return app


async def start_sample_app(
    config: SampleAppConfig, *, host: str = "127.0.0.1", port: int = 0
) -> tuple[web.AppRunner, int]:
    """Start serving; returns the runner (call `cleanup()`) and the bound port."""
    runner = web.AppRunner(SampleApp(config).application(), access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    await site.start()
    bound = port
    server = site._server
    sockets = getattr(server, "sockets", None)
    if sockets:
        bound = int(sockets[0].getsockname()[1])
    return runner, bound


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="tideshift serve-sample",
        description="A sample serving replica with a fixed capacity and Prometheus metrics "
        f"({REQUESTS_METRIC}{{app,code}}, {LATENCY_METRIC}{{app}}).",
    )
    parser.add_argument("--app", default="web", help="value of the `app` label (default: web)")
    parser.add_argument("--host", default="127.0.0.1", help="listen address (default: 127.0.0.1)")
    parser.add_argument("--port", type=int, default=8080, help="listen port (default: 8080)")
    parser.add_argument(
        "--capacity-rps",
        type=float,
        default=50.0,
        help="requests/s one replica serves within its latency target (default: 50)",
    )
    parser.add_argument(
        "--service-time-s", type=float, default=0.02, help="work per request (default: 0.02)"
    )
    parser.add_argument(
        "--latency-target-s",
        type=float,
        default=0.25,
        help="requests waiting longer are shed with 503 (default: 0.25)",
    )
    return parser


async def _serve(config: SampleAppConfig, host: str, port: int) -> int:
    stopping = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stopping.set)
    try:
        runner, bound = await start_sample_app(config, host=host, port=port)
    except OSError as error:
        print(
            f"tideshift serve-sample: cannot listen on {host}:{port} ({error.strerror}); "
            "is the port taken? choose another with --port",
            file=sys.stderr,
        )
        return 1
    print(
        f"serving app={config.app} on http://{host}:{bound}/ "
        f"(capacity {config.capacity_rps:g} req/s, {config.workers} workers); metrics on /metrics",
        file=sys.stderr,
        flush=True,
    )
    try:
        await stopping.wait()
    finally:
        with contextlib.suppress(Exception):
            await runner.cleanup()
    return 0


def main(argv: Sequence[str]) -> int:
    parser = build_parser()
    args = parser.parse_args(list(argv))
    if not 0 <= args.port <= 65535:
        parser.error(f"--port: expected 0..65535, got {args.port}")
    try:
        config = SampleAppConfig(
            app=args.app,
            capacity_rps=args.capacity_rps,
            service_time_s=args.service_time_s,
            latency_target_s=args.latency_target_s,
        )
    except ValueError as error:
        parser.error(str(error))
    return asyncio.run(_serve(config, args.host, args.port))
