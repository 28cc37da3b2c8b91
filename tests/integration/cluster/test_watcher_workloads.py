"""The watcher's labelled workloads on real NATS, through a port of our own: announced with
their policy (a batch job with what its trainers borrow), removed on deletion, and an
unreadable annotation reported once on the object, counted and dead-lettered while the rest
carries on."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import replace
from typing import Any

from prometheus_client import REGISTRY

from tests.integration.cluster.test_watcher_executor_bus import eventually
from tideshift.events import DEAD_LETTER, WORKLOAD_CHANGED, WorkloadChanged, WorkloadRef
from tideshift.services.cluster.port import ClusterChange, Node, Pod, Resources, Workload
from tideshift.services.common.bus import Bus
from tideshift.services.watcher.core.snapshot import workload_key
from tideshift.services.watcher.watcher import INVALID_POLICY_REASON, Watcher


def workload(namespace: str, name: str, **annotations: str) -> Workload:
    return Workload(
        ref=WorkloadRef(namespace, "Job.batch.volcano.sh", name),
        role="training",
        replicas=4,
        ready_replicas=4,
        min_replicas=2,
        max_replicas=None,
        requests=Resources(cpu=2.0),
        annotations=tuple(sorted((f"tideshift.io/{k}", v) for k, v in annotations.items())),
    )


class WorkloadPort:
    """Lists the given workloads, then yields the changes put on its queue."""

    def __init__(self, workloads: list[Workload]) -> None:
        self.workloads = workloads
        self.changes: asyncio.Queue[ClusterChange] = asyncio.Queue()
        self.events: list[tuple[WorkloadRef, str, str]] = []

    async def list_nodes(self) -> list[Node]:
        return []

    async def list_pods(self) -> list[Pod]:
        return []

    async def list_workloads(self) -> list[Workload]:
        return list(self.workloads)

    async def watch(self) -> AsyncIterator[ClusterChange]:
        while True:
            yield await self.changes.get()

    async def record_event(self, target: Workload, *, reason: str, message: str) -> None:
        self.events.append((target.ref, reason, message))


def invalid_count() -> float:
    return REGISTRY.get_sample_value("tideshift_watcher_invalid_policies_total") or 0.0


async def test_workloads_are_announced_removed_and_bad_annotations_reported_once(
    bus: Bus, unique: str
) -> None:
    good = replace(
        workload(unique, "ctr", **{"scale-task": "trainer", "gang-min": "2", "batch": "true"}),
        requests=Resources(),
        batch_requests=Resources(cpu=1.5, memory=2**31),
    )
    bad = workload(unique, "typo", **{"max-replicas": "eight"})
    port = WorkloadPort([good, bad])
    announced: list[WorkloadChanged] = []
    letters: list[Any] = []

    async def follow(subject: Any, into: list[Any]) -> None:
        async for envelope in bus.subscribe(subject, consumer=f"t-{unique}"):
            into.append(envelope.data)

    followers = [
        asyncio.create_task(follow(WORKLOAD_CHANGED.filter(namespace=unique), announced)),
        asyncio.create_task(follow(DEAD_LETTER.filter(consumer="watcher"), letters)),
    ]
    await asyncio.sleep(0)
    await bus.flush()
    counted = invalid_count()
    watcher = Watcher(port, bus, bucket=f"snap_{unique}")  # type: ignore[arg-type]
    task = asyncio.create_task(watcher.run())
    try:
        await eventually(lambda: announced and port.events, "the first reconcile")
        (event,) = announced
        assert event.workload == good.ref and event.change == "added"
        assert event.training is not None and event.training.gang_min == 2
        assert event.training.scale_task == "trainer" and event.min_replicas == 2
        assert event.training.batch and (event.requests.cpu, event.requests.memory) == (1.5, 2**31)
        ((ref, reason, message),) = port.events
        assert ref == bad.ref and reason == INVALID_POLICY_REASON
        assert "tideshift.io/max-replicas='eight'" in message
        await eventually(lambda: letters, "the dead letter")
        assert "tideshift.io/max-replicas" in letters[0].reason
        assert invalid_count() == counted + 1

        # The bad workload changes status but not its annotation: counted, not re-reported.
        await port.changes.put(ClusterChange("modified", bad))
        await port.changes.put(ClusterChange("deleted", good))
        await eventually(lambda: len(announced) == 2, "the removal")
        assert announced[1].change == "deleted" and announced[1].workload == good.ref
        assert len(port.events) == 1 and invalid_count() == counted + 2
        await watcher.flushed()
        snapshot = await bus.kv(f"snap_{unique}")
        assert await snapshot.get(workload_key(good.ref), WorkloadChanged) is None

        # Fixed, it is announced; broken again later, its owner is told again.
        fixed = workload(unique, "typo", **{"max-replicas": "8"})
        await port.changes.put(ClusterChange("modified", fixed))
        await eventually(lambda: len(announced) == 3, "the fixed workload")
        assert announced[2].workload == bad.ref and announced[2].training is not None
        await port.changes.put(ClusterChange("modified", bad))
        await eventually(lambda: len(port.events) == 2, "the second report")
    finally:
        task.cancel()
        for follower in followers:
            follower.cancel()
        for pending in (task, *followers):
            with contextlib.suppress(asyncio.CancelledError):
                await pending
