"""The predictor keeps one time base: its clock's. Under a simulated clock far faster than the
wall clock, the time between its forecasts and between its observed-demand messages is
simulated time (the demo passes its simulated clock; `tideshift run predictor` the wall)."""

from __future__ import annotations

import asyncio
import itertools
from typing import Any

from tideshift.events.models import DemandObserved, ForecastIssued
from tideshift.services.common.runtime import ServiceContext
from tideshift.services.demo.clock import SimClock
from tideshift.services.predictor.service import Fleet
from tideshift.services.predictor.settings import PredictorSettings, WorkloadQuery
from tideshift.services.predictor.sources import SimMetricSource

START = 1_767_571_200.0  # 2026-01-05 00:00 UTC
FAST = 20_000.0  # simulated seconds per wall second
MESSAGES = 4


class RecordingBus:
    """Records the clock time each message was made at (its own stamp, read when its step
    began), by kind; sets `enough` once each kind has `MESSAGES` (our own bus port: nothing
    here is about NATS)."""

    def __init__(self) -> None:
        self.sent: dict[str, list[float]] = {"forecast": [], "observed": []}
        self.enough = asyncio.Event()

    async def publish(self, subject: Any, event: ForecastIssued | DemandObserved) -> None:
        if isinstance(event, DemandObserved):
            self.sent["observed"].append(event.observed_at.timestamp())
        else:
            self.sent["forecast"].append(event.issued_at.timestamp())
        if all(len(times) >= MESSAGES for times in self.sent.values()):
            self.enough.set()


async def test_forecast_and_observe_intervals_are_clock_time() -> None:
    clock = SimClock(FAST, start=START)
    settings = PredictorSettings(
        health_port=-1,
        metric_source="sim",
        model="seasonal_naive_daily",
        step_seconds=300.0,
        horizon_seconds=3600.0,
        history_seconds=2 * 86400.0,
        refresh_seconds=1800.0,
        observe_seconds=600.0,
    )
    bus = RecordingBus()
    context = ServiceContext(
        name="predictor",
        settings=settings,
        bus=bus,  # type: ignore[arg-type]  # only publish is used
        instance="t",
    )
    fleet = Fleet(settings, context, clock=clock, source=SimMetricSource(lambda _: 100.0))
    fleet.start(WorkloadQuery(namespace="shop", name="web"))
    try:
        # 4 forecasts 30 simulated minutes apart take well under a wall second at this speed;
        # loops that waited wall seconds would need an hour and a half.
        await asyncio.wait_for(bus.enough.wait(), 30.0)
    finally:
        context.stopping.set()
        await fleet.stop_all()
    for kind, interval in (("forecast", 1800.0), ("observed", 600.0)):
        gaps = [later - earlier for earlier, later in itertools.pairwise(bus.sent[kind])]
        assert len(gaps) >= MESSAGES - 1, kind
        assert all(gap >= interval for gap in gaps), (kind, gaps)
