"""The predictor against a real Prometheus scraping a real exporter, publishing on real NATS."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Callable

import pytest

from tests.fixtures.prometheus import PrometheusServer, RateExporter
from tideshift.events.models import ForecastIssued
from tideshift.events.subjects import FORECAST
from tideshift.services.common.bus import Bus
from tideshift.services.common.runtime import ServiceContext
from tideshift.services.predictor.service import serve as run
from tideshift.services.predictor.settings import PredictorSettings

pytestmark = [pytest.mark.prometheus, pytest.mark.timeout(420)]

PHASE_TIMEOUT_S = 120.0


class Forecasts:
    """Forecasts received on the bus, for waiting on conditions."""

    def __init__(self) -> None:
        self.received: list[ForecastIssued] = []
        self.changed = asyncio.Event()

    def add(self, event: ForecastIssued) -> None:
        self.received.append(event)
        self.changed.set()

    async def wait_for(
        self, condition: Callable[[ForecastIssued], bool], *, what: str
    ) -> ForecastIssued:
        deadline = time.monotonic() + PHASE_TIMEOUT_S
        seen = 0
        while True:
            for event in self.received[seen:]:
                if condition(event):
                    return event
            seen = len(self.received)
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                last = self.received[-1] if self.received else None
                raise AssertionError(f"no forecast {what}; last: {last}")
            self.changed.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.changed.wait(), remaining)


@contextlib.asynccontextmanager
async def running_predictor(
    bus: Bus, settings: PredictorSettings, namespace: str
) -> AsyncIterator[Forecasts]:
    forecasts = Forecasts()
    subject = FORECAST.at(namespace=namespace, workload="web")

    async def listen() -> None:
        async for envelope in bus.subscribe(subject, consumer="test-predictor"):
            forecasts.add(envelope.data)

    listener = asyncio.create_task(listen())
    await asyncio.sleep(0)  # let the subscription register before the first publish
    await bus.flush()
    context = ServiceContext(name="predictor", settings=settings, bus=bus, instance="test")
    service = asyncio.create_task(run(settings, context))
    try:
        yield forecasts
    finally:
        context.stopping.set()
        await asyncio.wait_for(service, 30)
        listener.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await listener


def near(value: float, target: float, tolerance: float) -> bool:
    return abs(value - target) <= tolerance * target


async def test_forecasts_track_the_rate_and_survive_a_prometheus_restart(
    bus: Bus,
    unique: str,
    rate_exporter: RateExporter,
    prometheus_server: PrometheusServer,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="tideshift.predictor")
    namespace = f"ns-{unique}"
    rate_exporter.set_rate(50.0)
    settings = PredictorSettings(
        prometheus_url=prometheus_server.url,
        workloads=[{"namespace": namespace, "name": "web"}],
        query_template='sum(rate(http_requests_total{app="$name"}[4s]))',
        step_seconds=1.0,
        horizon_seconds=10.0,
        history_seconds=600.0,
        refit_seconds=15.0,
        refresh_seconds=0.5,
        query_timeout_seconds=2.0,
        stale_after_seconds=4.0,
        health_port=-1,
    )
    async with running_predictor(bus, settings, namespace) as forecasts:
        first = await forecasts.wait_for(
            lambda event: not event.stale and near(event.points[0].q50, 50.0, 0.2),
            what="tracking 50 req/s",
        )
        assert first.model == "portfolio"
        assert first.workload.namespace == namespace
        assert all(p.q50 <= p.q90 <= p.q95 <= p.q99 for p in first.points)

        rate_exporter.set_rate(150.0)
        await forecasts.wait_for(
            lambda event: not event.stale and near(event.points[0].q50, 150.0, 0.2),
            what="tracking the step up to 150 req/s",
        )

        # Only this workload's lines: the predictor also forecasts workloads other tests
        # announced on the session's NATS, and logs their outages too.
        def outage_logs() -> list[str]:
            return [
                message
                for message in (r.getMessage() for r in caplog.records)
                if message.startswith(f"{namespace}/web: metric source failing")
            ]

        # (The start may already count as one outage: no samples until the first scrapes.)
        logged_before_kill = len(outage_logs())
        prometheus_server.kill()
        stale = await forecasts.wait_for(lambda event: event.stale, what="marked stale")
        assert "Prometheus" in stale.stale_reason or "samples" in stale.stale_reason
        fresh_before = [e for e in forecasts.received if not e.stale][-1]
        # Stale forecasts widen the upper quantiles but keep the median.
        assert stale.points[-1].q95 > fresh_before.points[-1].q95
        await asyncio.sleep(0)

        prometheus_server.start()
        # The first samples after the restart may cover a partly scraped rate window: the
        # forecasts must come back fresh and track the rate again, not at once.
        await forecasts.wait_for(
            lambda event: (
                not event.stale
                and event.issued_at > stale.issued_at
                and near(event.points[0].q50, 150.0, 0.3)
            ),
            what="fresh again after the restart, tracking 150 req/s",
        )

        # Many stale forecasts, one log line for the whole outage (a relapse while the
        # restarted Prometheus scrapes again continues it), and a recovery logged.
        assert len(outage_logs()) == logged_before_kill + 1, outage_logs()
        assert any(
            r.getMessage().startswith(f"{namespace}/web: metrics are back") for r in caplog.records
        )
