"""The watcher's memory after a burst (issue 25, bounded memory): once the snapshot writes are
done, no event of the burst is left in memory; the writer waiting for the next change held
the whole last batch before."""

from __future__ import annotations

import asyncio
import gc

from tests.integration.cluster.test_watcher_executor_bus import eventually
from tests.integration.cluster.test_watcher_workloads import WorkloadPort
from tideshift.events import PodChanged
from tideshift.services.cluster.port import ClusterChange, Pod, Resources
from tideshift.services.common.bus import Bus
from tideshift.services.watcher.watcher import Watcher


def alive(namespace: str) -> int:
    gc.collect()
    return sum(
        1 for o in gc.get_objects() if isinstance(o, PodChanged) and o.namespace == namespace
    )


async def test_no_event_of_a_written_burst_stays_in_memory(bus: Bus, unique: str) -> None:
    port = WorkloadPort([])
    watcher = Watcher(port, bus, bucket=f"snap_{unique}")  # type: ignore[arg-type]
    listed = asyncio.Event()
    task = asyncio.create_task(watcher.run(listed))
    try:
        await asyncio.wait_for(listed.wait(), 30)
        for index in range(200):
            pod = Pod(unique, f"p-{index}", Resources(cpu=0.1), resource_version=str(index + 1))
            await port.changes.put(ClusterChange("added", pod))
        await eventually(lambda: watcher.published == 200, "the burst published")
        await asyncio.wait_for(watcher.flushed(), 30)
        assert watcher.snapshot is not None
        assert len(await watcher.snapshot.keys()) == 200
        assert alive(unique) == 0
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
