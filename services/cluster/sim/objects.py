"""The simulated cluster's objects: pods, workloads (Deployments and elastic jobs), nodes and
the counters the simulator reports. State only: the scheduling decisions are in `cluster.py`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from tideshift.services.cluster.port import (
    COMPANION_LABEL,
    Node,
    Pod,
    PodPhase,
    Resources,
    Role,
    WorkloadRef,
)
from tideshift.services.core.constants import EPS

WorkloadKind = Literal["Deployment", "ElasticJob"]


@dataclass(slots=True)
class SimPod:
    namespace: str
    name: str
    requests: Resources
    priority: int
    owner: WorkloadRef
    role: Role
    companion: bool  # parameter server of an elastic job (not a trainer)
    created_at: float
    seq: int  # creation order, a tie-breaker
    node: str | None = None
    bound_at: float | None = None
    ready: bool = False

    @property
    def counter_key(self) -> str:
        return "companion" if self.companion else self.role

    def snapshot(self) -> Pod:
        phase: PodPhase = "Running" if self.node is not None else "Pending"
        return Pod(
            namespace=self.namespace,
            name=self.name,
            requests=self.requests,
            priority=self.priority,
            owner=self.owner,
            role=self.role,
            phase=phase,
            node=self.node,
            created_at=self.created_at,
            ready=self.ready,
            labels=((COMPANION_LABEL, "true"),) if self.companion else (),
        )


@dataclass(slots=True)
class SimWorkload:
    """A Deployment or an elastic training job inside the simulator."""

    ref: WorkloadRef
    kind: WorkloadKind
    role: Role
    pod_requests: Resources
    replicas: int
    priority: int = 0
    startup_delay_s: float = 0.0
    min_replicas: int = 0
    max_replicas: int | None = None
    gang_min: int = 0  # elastic jobs: trainers that must bind together before any runs
    companion_count: int = 0  # elastic jobs: parameter servers
    companion_requests: Resources = field(default_factory=Resources)
    pods: list[SimPod] = field(default_factory=list)
    # Maintained by the cluster so per-step metrics need no scan of the pods.
    bound_workers: int = 0
    ready_workers: int = 0
    bound_companions: int = 0
    ready_companions: int = 0

    def _count(self, pod: SimPod, *, bound: int = 0, ready: int = 0) -> None:
        if pod.companion:
            self.bound_companions += bound
            self.ready_companions += ready
        else:
            self.bound_workers += bound
            self.ready_workers += ready

    def clamp(self, replicas: int) -> int:
        replicas = max(replicas, self.min_replicas, 0)
        if self.max_replicas is not None:
            replicas = min(replicas, self.max_replicas)
        return replicas


@dataclass(slots=True)
class SimNode:
    node: Node
    free: list[float]  # cpu, memory, gpu left after bound pods
    pods: dict[str, SimPod] = field(default_factory=dict)


@dataclass
class SimCounters:
    """Totals since the cluster was created, for the simulator's reports."""

    # per role ("serving", "training" for trainers, "other"), "companion" for parameter servers
    pods_bound: dict[str, int] = field(default_factory=dict)
    pods_stopped: dict[str, int] = field(default_factory=dict)  # bound pods deleted
    preemptions: int = 0


def as_list(resources: Resources) -> list[float]:
    return [resources.cpu, resources.memory, float(resources.gpu)]


def fits_in(request: Resources, free: list[float]) -> bool:
    return (
        request.cpu <= free[0] + EPS
        and request.memory <= free[1] + 1e-6
        and request.gpu <= free[2] + EPS
    )
