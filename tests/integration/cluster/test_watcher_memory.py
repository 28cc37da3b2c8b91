"""The watcher's memory after a burst (issue 25, bounded memory): once the snapshot writes are
done, no event of the burst is left in memory; the writer waiting for the next change held
the whole last batch before."""

from __future__ import annotations

import asyncio
import gc
from collections.abc import AsyncIterator

from tests.integration.cluster.test_watcher_executor_bus import eventually
from tests.integration.cluster.test_watcher_workloads import WorkloadPort
from tideshift.events import PodChanged
from tideshift.services.cluster.port import ClusterChange, Pod, Resources
from tideshift.services.common.bus import Bus
from tideshift.services.watcher.core.snapshot import pod_key
from tideshift.services.watcher.watcher import (
    DELETE_MARKER_TTL_SECONDS,
    ClusterEvent,
    Watcher,
)


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


class CountingWatcher(Watcher):
    """Notes the most snapshot writes ever waiting at once."""

    most_pending = 0

    def _store_later(self, key: str, event: ClusterEvent | None) -> None:
        super()._store_later(key, event)
        self.most_pending = max(self.most_pending, len(self._pending))


class FloodPort(WorkloadPort):
    """Yields `added` pods then deletes the first half, as fast as they are taken."""

    def __init__(self, namespace: str, pods: int) -> None:
        super().__init__([])
        self.namespace, self.pods = namespace, pods

    async def watch(self) -> AsyncIterator[ClusterChange]:
        for index in range(self.pods):
            pod = Pod(self.namespace, f"p-{index}", Resources(cpu=0.1), resource_version="")
            yield ClusterChange("added", pod)
        for index in range(self.pods // 2):
            pod = Pod(self.namespace, f"p-{index}", Resources(cpu=0.1), resource_version="")
            yield ClusterChange("deleted", pod)
        await asyncio.Event().wait()  # then nothing more, as a quiet cluster


async def test_a_flood_waits_for_the_snapshot_writer_and_loses_nothing(
    bus: Bus, unique: str
) -> None:
    port = FloodPort(unique, 600)
    watcher = CountingWatcher(port, bus, bucket=f"snap_{unique}", max_pending_writes=16)  # type: ignore[arg-type]
    task = asyncio.create_task(watcher.run())
    try:
        await eventually(lambda: watcher.published == 900, "the flood published")
        await asyncio.wait_for(watcher.flushed(), 60)
        assert watcher.most_pending == 16  # the flood outran the writer, and waited for it
        assert watcher.snapshot is not None
        kept = {key.rsplit(".", 1)[1] for key in await watcher.snapshot.keys()}
        assert kept == {f"p-{index}" for index in range(300, 600)}
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def test_a_deleted_object_leaves_a_marker_that_expires(bus: Bus, unique: str) -> None:
    port = WorkloadPort([])
    bucket = f"snap_{unique}"
    watcher = Watcher(port, bus, bucket=bucket)  # type: ignore[arg-type]
    listed = asyncio.Event()
    task = asyncio.create_task(watcher.run(listed))
    try:
        await asyncio.wait_for(listed.wait(), 30)
        pod = Pod(unique, "gone", Resources(cpu=0.1), resource_version="1")
        await port.changes.put(ClusterChange("added", pod))
        await eventually(lambda: watcher.published == 1, "the add published")
        await asyncio.wait_for(watcher.flushed(), 30)
        deleted = Pod(unique, "gone", Resources(cpu=0.1), resource_version="2")
        await port.changes.put(ClusterChange("deleted", deleted))
        await eventually(lambda: watcher.published == 2, "the deletion published")
        await asyncio.wait_for(watcher.flushed(), 30)
        subject = f"$KV.{bucket}.{pod_key(unique, 'gone')}"
        marker = await bus.js.get_last_msg(f"KV_{bucket}", subject)
        assert marker.headers is not None
        assert marker.headers.get("KV-Operation") == "PURGE"  # the add's value went with it
        assert marker.headers.get("Nats-TTL") == str(DELETE_MARKER_TTL_SECONDS)
        info = await bus.js.stream_info(f"KV_{bucket}")
        assert info.state.messages == 1
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
