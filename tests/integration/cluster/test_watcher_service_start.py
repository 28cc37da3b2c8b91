"""The watcher service retries a failed start on its clock and stops on the stop signal."""

from __future__ import annotations

import asyncio

from tideshift.services.cluster.port import Node, Resources
from tideshift.services.cluster.sim import SimCluster, SimClusterPort
from tideshift.services.common.bus import Bus
from tideshift.services.common.runtime import ServiceContext
from tideshift.services.watcher import service as watcher_service

WAIT = 20.0


class InstantClock:
    """Waits no time, so a retry's wait costs nothing; reads the real time."""

    def __init__(self) -> None:
        self.waited: list[float] = []

    def now(self) -> float:
        return asyncio.get_running_loop().time()

    async def sleep(self, seconds: float) -> None:
        self.waited.append(seconds)
        await asyncio.sleep(0)


class ApiserverComingUp(SimClusterPort):
    """Refuses the first `refusals` node listings, as an apiserver still starting does."""

    def __init__(self, cluster: SimCluster, refusals: int) -> None:
        super().__init__(cluster)
        self.refusals = refusals
        self.closed = False

    async def list_nodes(self) -> list[Node]:
        if self.refusals:
            self.refusals -= 1
            raise ConnectionError("apiserver not up yet")
        return await super().list_nodes()

    async def close(self) -> None:
        self.closed = True
        await super().close()


async def test_a_failed_start_is_retried_after_the_start_wait_then_stops(
    bus: Bus, unique: str
) -> None:
    cluster = SimCluster(now=0.0)
    cluster.add_node(Node("n1", Resources(cpu=8, memory=2**34)))
    port = ApiserverComingUp(cluster, refusals=2)
    clock = InstantClock()
    settings = watcher_service.WatcherSettings(health_port=-1, snapshot_bucket=f"snap_{unique}")
    context = ServiceContext(name="watcher", settings=settings, bus=bus, instance="test")
    serving = asyncio.create_task(
        watcher_service.serve(settings, context, cluster=port, clock=clock)
    )
    await asyncio.wait_for(context.ready.wait(), WAIT)
    assert port.refusals == 0
    assert clock.waited == [watcher_service.START_RETRY.delay(1)] * 2
    context.stopping.set()
    await asyncio.wait_for(serving, WAIT)
    assert port.closed
