"""The simulated cluster behind the `ClusterPort` interface: async wrappers of `SimCluster`'s
synchronous methods, and its changes as a watch stream."""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import AsyncIterator
from typing import Literal

from tideshift.services.cluster.port import (
    ClusterChange,
    Node,
    Pod,
    ScaleState,
    Workload,
    WorkloadRef,
)
from tideshift.services.cluster.sim.cluster import SimCluster


class SimClusterPort:
    """`ClusterPort` over a `SimCluster` (the simulator drives time; this only observes/sets)."""

    def __init__(self, cluster: SimCluster) -> None:
        self.cluster = cluster
        # record_event's, in order; the latest only, so a long demo's memory stays bounded
        self.events: deque[tuple[WorkloadRef, str, str]] = deque(maxlen=1000)

    async def list_nodes(self) -> list[Node]:
        return self.cluster.nodes()

    async def list_pods(self) -> list[Pod]:
        return self.cluster.pods()

    async def list_workloads(self) -> list[Workload]:
        """None: simulated workloads are named in the settings, not labelled."""
        return []

    async def record_event(
        self,
        target: Workload | WorkloadRef,
        *,
        reason: str,
        message: str,
        event_type: Literal["Normal", "Warning"] = "Warning",
    ) -> None:
        """Kept in `events`; the type follows from the reason."""
        ref = target.ref if isinstance(target, Workload) else target
        self.events.append((ref, reason, message))

    async def watch(self) -> AsyncIterator[ClusterChange]:
        queue: asyncio.Queue[ClusterChange] = asyncio.Queue()
        unsubscribe = self.cluster.subscribe(queue.put_nowait)
        try:
            while True:
                yield await queue.get()
        finally:
            unsubscribe()

    def unwatched(self) -> list[str]:
        """Nothing: the simulated cluster calls its subscribers directly."""
        return []

    async def get_scale(self, target: WorkloadRef) -> ScaleState:
        return self.cluster.scale_state(target)

    async def set_scale(self, target: WorkloadRef, replicas: int) -> ScaleState:
        return self.cluster.scale(target, replicas)

    async def close(self) -> None:
        """Nothing to release: the simulated cluster lives in this process."""
