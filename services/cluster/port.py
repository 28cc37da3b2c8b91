"""The cluster port's values and errors, and `ClusterPort`: everything a backend (Kubernetes,
the simulated cluster) offers. Each user declares the narrow part it needs beside itself (the
watcher's `ClusterReader` and `EventRecorder`, the executor's `ScaleWriter` and
`ClusterListing`); any backend satisfies them. Decides nothing; imports only `events`.

Value types are frozen dataclasses so snapshots can be shared between tasks without copies.
Resource quantities use plain units: cpu in cores, memory in bytes, GPUs as a count of
`nvidia.com/gpu`.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Literal, Protocol

from tideshift.events.models import WorkloadRef

# The contract's workload identity is the port's target type too, re-exported with the rest.
__all__ = [
    "COMPANION_LABEL",
    "ROLE_LABEL",
    "ChangeType",
    "ClusterChange",
    "ClusterError",
    "ClusterPort",
    "Node",
    "Pod",
    "PodPhase",
    "Resources",
    "Role",
    "ScaleState",
    "UnsupportedTarget",
    "Workload",
    "WorkloadRef",
]

# Labels users put on pod templates (listed in docs/reference/annotations.md).
ROLE_LABEL = "tideshift.io/role"  # serving | training | other (also read as an annotation)
COMPANION_LABEL = "tideshift.io/companion"  # "true": a fixed helper of a job, not a trainer

Role = Literal["serving", "training", "other"]
PodPhase = Literal["Pending", "Running", "Succeeded", "Failed"]
ChangeType = Literal["added", "modified", "deleted"]


@dataclass(frozen=True, slots=True)
class Resources:
    """An amount of schedulable resources (requests or allocatable)."""

    cpu: float = 0.0  # cores
    memory: float = 0.0  # bytes
    gpu: int = 0  # nvidia.com/gpu

    def __add__(self, other: Resources) -> Resources:
        return Resources(self.cpu + other.cpu, self.memory + other.memory, self.gpu + other.gpu)

    def __sub__(self, other: Resources) -> Resources:
        return Resources(self.cpu - other.cpu, self.memory - other.memory, self.gpu - other.gpu)

    def times(self, count: int) -> Resources:
        return Resources(self.cpu * count, self.memory * count, self.gpu * count)

    def vector(self) -> tuple[float, float, float]:
        """(cpu, memory, gpu): the shape the policy and the packing model compute with."""
        return (self.cpu, self.memory, float(self.gpu))


@dataclass(frozen=True, slots=True)
class Node:
    name: str
    allocatable: Resources
    ready: bool = True
    unschedulable: bool = False
    labels: tuple[tuple[str, str], ...] = ()
    resource_version: str = ""  # the apiserver's version of this object ("" in the sim)

    @property
    def schedulable(self) -> bool:
        return self.ready and not self.unschedulable


@dataclass(frozen=True, slots=True)
class Pod:
    namespace: str
    name: str
    requests: Resources
    priority: int = 0
    owner: WorkloadRef | None = None  # the scalable workload, resolved through ReplicaSets etc.
    role: Role = "other"
    phase: PodPhase = "Pending"
    node: str | None = None  # bound node; None while unscheduled
    created_at: float = 0.0  # seconds (cluster clock)
    ready: bool = False  # Running and passed readiness (the sim: start-up delay elapsed)
    labels: tuple[tuple[str, str], ...] = field(default=())
    uid: str = ""
    priority_class: str | None = None
    deleting: bool = False  # deletionTimestamp set: terminating, about to go
    resource_version: str = ""  # the apiserver's version of this object ("" in the sim)

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    @property
    def companion(self) -> bool:
        """A fixed helper pod of a training job (a parameter server), not an elastic trainer."""
        return (COMPANION_LABEL, "true") in self.labels


@dataclass(frozen=True, slots=True)
class Workload:
    """A scale target labelled `tideshift.io/role` (serving or training), as the cluster has it:
    its scale and own bounds, one replica's requests (from its pod template) and its
    annotations, which the watcher reads as the workload's policy."""

    ref: WorkloadRef
    role: Role
    replicas: int  # desired replicas in its spec (Volcano: the scaled task's)
    ready_replicas: int
    min_replicas: int  # its own bounds (gang minimum, elasticPolicy, bound annotations)
    max_replicas: int | None
    requests: Resources  # one replica's, from the pod template
    annotations: tuple[tuple[str, str], ...] = ()
    # What one replica borrows from serving's idle reservation: its template's
    # tideshift.io/batch-cpu (as cores) and tideshift.io/batch-memory requests.
    batch_requests: Resources = Resources()
    uid: str = ""
    resource_version: str = ""  # the apiserver's version of this object
    unscalable: str = ""  # why its scale cannot be read (e.g. scale-task names no task)
    # Why another engine keeps its size (e.g. an admitted Kueue job without workload slices):
    # read and announced, but held where it is.
    held_by: str = ""


@dataclass(frozen=True, slots=True)
class ScaleState:
    """A target's current scale and the bounds it accepts (elastic jobs carry their own)."""

    target: WorkloadRef
    replicas: int  # desired replicas currently in the spec
    ready_replicas: int = 0
    min_replicas: int = 0
    max_replicas: int | None = None  # None: unbounded by the target itself
    # The target's own `tideshift.io/role` label (serving | training): None when it has not
    # joined Tideshift, which the executor then refuses to scale unless told otherwise.
    role: str | None = None


@dataclass(frozen=True, slots=True)
class ClusterChange:
    """One observed change; `obj` is the object after the change (before, for deletions)."""

    type: ChangeType
    obj: Node | Pod | Workload


class UnsupportedTarget(ValueError):
    """The target's kind has no scale adapter in this backend."""


class ClusterError(RuntimeError):
    """The cluster did not do what was asked. `transient`: another try later may succeed
    (unreachable, overloaded, a write conflict that outlasted the port's own re-reads);
    otherwise the answer is definite (forbidden, invalid) and retrying cannot help."""

    def __init__(self, message: str, *, transient: bool, status: int | None = None) -> None:
        super().__init__(message)
        self.transient = transient
        self.status = status


class ClusterPort(Protocol):
    """All a backend offers: list+watch nodes, pods and labelled workloads, read and set a
    target's scale, record an event. What the demo hands to every service at once."""

    async def list_nodes(self) -> list[Node]: ...

    async def list_pods(self) -> list[Pod]: ...

    async def list_workloads(self) -> list[Workload]:
        """Labelled scale targets of every kind the backend supports (and the cluster serves)."""
        ...

    def watch(self) -> AsyncIterator[ClusterChange]:
        """Changes after the last list, in order, until the iterator is closed."""
        ...

    def unwatched(self) -> list[str]:
        """Resources a running `watch` is not following right now (its watch is down and
        being restarted): changes to them are late until it is back."""
        ...

    async def get_scale(self, target: WorkloadRef) -> ScaleState:
        """Raises KeyError when the target does not exist, UnsupportedTarget for its kind,
        ClusterError when the cluster cannot answer."""
        ...

    async def set_scale(self, target: WorkloadRef, replicas: int) -> ScaleState:
        """Sets the target's desired replicas (clamped to its own bounds); returns the result.
        Raises as `get_scale` does."""
        ...

    async def record_event(
        self,
        target: Workload | WorkloadRef,
        *,
        reason: str,
        message: str,
        event_type: Literal["Normal", "Warning"] = "Warning",
    ) -> None:
        """Leave an Event on the object for its owner to see (`kubectl describe`)."""
        ...

    async def close(self) -> None:
        """Release connections and threads."""
        ...
