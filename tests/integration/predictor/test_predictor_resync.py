"""Announcements travel on core NATS, which drops when a burst outruns the predictor: the
predictor's periodic resync with the watcher's snapshot (NATS KV) forecasts an announced
workload whose announcement was lost, and stops one whose deletion was lost."""

from __future__ import annotations

import asyncio
import contextlib

from tests.integration.predictor.test_predictor_announced import announced
from tideshift.events import WorkloadRef
from tideshift.services.common.bus import Bus
from tideshift.services.common.clock import WallClock
from tideshift.services.common.runtime import ServiceContext
from tideshift.services.predictor.service import Fleet, build_source
from tideshift.services.predictor.settings import PredictorSettings
from tideshift.services.watcher.core.snapshot import workload_key


async def test_a_resync_heals_lost_additions_and_deletions(bus: Bus, unique: str) -> None:
    settings = PredictorSettings(
        metric_source="sim",
        model="tidal",
        history_seconds=86400.0,
        snapshot_bucket=f"snapshot_{unique}",
        health_port=-1,
    )
    snapshot = await bus.kv(settings.snapshot_bucket)
    kept = WorkloadRef(unique, "Deployment.apps", "kept")  # its announcement was lost
    gone = WorkloadRef(unique, "Deployment.apps", "gone")  # its deletion was lost
    await snapshot.put(workload_key(kept), announced(kept))
    context = ServiceContext(name="predictor", settings=settings, bus=bus, instance="t")
    fleet = Fleet(settings, context, clock=WallClock(), source=build_source(settings), resync_s=0.2)
    fleet.apply(announced(gone))
    assert set(fleet.loops) == {gone}
    resyncing = asyncio.create_task(fleet.resync())
    try:
        for _ in range(600):  # 30 s
            if set(fleet.loops) == {kept}:
                break
            await asyncio.sleep(0.05)
        assert set(fleet.loops) == {kept}
    finally:
        context.stopping.set()
        resyncing.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await resyncing
        await fleet.stop_all()
