"""What the demo's meter reads from a cluster: the simulated one, or a listing of a real one
through its ClusterPort. Counts only; no clock, no I/O."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol

import numpy as np

from tideshift.services.cluster.core.placement import FloatArray
from tideshift.services.cluster.port import Node, Pod, Resources, WorkloadRef
from tideshift.services.cluster.sim import SimCluster


class ClusterFigures(Protocol):
    """What the meter reads from a cluster (the sim, or a listing of a real one)."""

    def allocatable_total(self) -> Resources: ...

    def bound_requests_total(self) -> Resources: ...

    def ready_count(self, ref: WorkloadRef) -> int: ...

    def bound_count(self, ref: WorkloadRef) -> int: ...

    def bound_companions(self, ref: WorkloadRef) -> int: ...

    def job_running(self, ref: WorkloadRef) -> bool: ...

    def free_room(self) -> FloatArray: ...


class SimFigures:
    def __init__(self, cluster: SimCluster) -> None:
        self.cluster = cluster

    def allocatable_total(self) -> Resources:
        return self.cluster.allocatable_total()

    def bound_requests_total(self) -> Resources:
        return self.cluster.bound_requests_total()

    def ready_count(self, ref: WorkloadRef) -> int:
        return self.cluster.ready_count(ref)

    def bound_count(self, ref: WorkloadRef) -> int:
        return self.cluster.bound_count(ref)

    def bound_companions(self, ref: WorkloadRef) -> int:
        return self.cluster.workload(ref).bound_companions

    def job_running(self, ref: WorkloadRef) -> bool:
        return self.cluster.job_running(ref)

    def free_room(self) -> FloatArray:
        return self.cluster.free_room()


class ListedFigures:
    """Figures from a listing of nodes and pods (a real cluster through its ClusterPort)."""

    def __init__(
        self,
        nodes: Iterable[Node],
        pods: Iterable[Pod],
        *,
        gang_min: int = 1,
        running_is_ready: bool = False,
    ) -> None:
        self.nodes = [node for node in nodes if node.schedulable]
        # kwok's fake kubelets do not restore a pod's Ready condition after a node heartbeat
        # lapses (a busy machine): there, Running is the honest reading of "serving".
        self.running_is_ready = running_is_ready
        self.pods = [
            pod for pod in pods if pod.phase in ("Pending", "Running") and not pod.deleting
        ]
        self.gang_min = gang_min

    def allocatable_total(self) -> Resources:
        total = Resources()
        for node in self.nodes:
            total = total + node.allocatable
        return total

    def bound_requests_total(self) -> Resources:
        total = Resources()
        for pod in self.pods:
            if pod.node is not None:
                total = total + pod.requests
        return total

    def _owned(self, ref: WorkloadRef) -> list[Pod]:
        return [pod for pod in self.pods if pod.owner == ref]

    def is_ready(self, pod: Pod) -> bool:
        if self.running_is_ready:
            return pod.phase == "Running" and pod.node is not None
        return pod.ready

    def ready_count(self, ref: WorkloadRef) -> int:
        return sum(1 for pod in self._owned(ref) if self.is_ready(pod) and not pod.companion)

    def bound_count(self, ref: WorkloadRef) -> int:
        return sum(1 for pod in self._owned(ref) if pod.node is not None and not pod.companion)

    def bound_companions(self, ref: WorkloadRef) -> int:
        return sum(1 for pod in self._owned(ref) if pod.node is not None and pod.companion)

    def job_running(self, ref: WorkloadRef) -> bool:
        return self.ready_count(ref) >= self.gang_min

    def free_room(self) -> FloatArray:
        row = {node.name: i for i, node in enumerate(self.nodes)}
        free = np.array(
            [
                (n.allocatable.cpu, n.allocatable.memory, float(n.allocatable.gpu))
                for n in self.nodes
            ]
        ).reshape(-1, 3)
        for pod in self.pods:
            if pod.node in row:
                free[row[pod.node]] -= (pod.requests.cpu, pod.requests.memory, pod.requests.gpu)
        return free
