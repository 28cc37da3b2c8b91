"""Kubernetes objects (plain JSON dicts) -> the port's values, and the changes between listings.

Decides what Tideshift reads from a Node, a Pod and a labelled scale target: requests, role,
owner, readiness. Pure: it must not import the `kubernetes` client, asyncio, the bus or
`services.common`, does no I/O and never reads the clock.

Labels and annotations read (on pods, set them in the pod template):

* `tideshift.io/role` (label, or annotation): `serving`, `training` or `other`. Without it,
  pods of PyTorchJobs and Volcano Jobs are `training`, everything else `other`.
* `tideshift.io/companion: "true"` (label): a fixed helper pod of a training job
  (a parameter server), not one of its elastic trainers.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import replace
from datetime import datetime
from decimal import Decimal, DecimalException, InvalidOperation
from typing import Any, Protocol, TypeVar, cast

from tideshift.services.cluster.core.engines import kueue_hold, kueue_size_owner
from tideshift.services.cluster.core.kinds import PYTORCH_JOB, VOLCANO_JOB, qualified_kind
from tideshift.services.cluster.core.overcommit import BATCH_CPU, BATCH_MEMORY
from tideshift.services.cluster.port import (
    ROLE_LABEL,
    ClusterChange,
    Node,
    Pod,
    PodPhase,
    Resources,
    Role,
    ScaleState,
    UnsupportedTarget,
    Workload,
    WorkloadRef,
)

log = logging.getLogger("tideshift.cluster.conversions")

GPU_RESOURCE = "nvidia.com/gpu"
TRAINING_KINDS = frozenset({PYTORCH_JOB, VOLCANO_JOB})
ROLES: frozenset[str] = frozenset({"serving", "training", "other"})
PHASES: frozenset[str] = frozenset({"Pending", "Running", "Succeeded", "Failed"})
WORKLOAD_SELECTOR = f"{ROLE_LABEL} in (serving,training)"

# Quantity suffixes as the apiserver writes them: decimal powers of 1000, binary of 1024.
_SUFFIX_EXPONENTS = {
    "n": -3,
    "u": -2,
    "m": -1,
    "K": 1,
    "k": 1,
    "M": 2,
    "G": 3,
    "T": 4,
    "P": 5,
    "E": 6,
}
_BINARY_PREFIXES = "KMGTPE"


class ScaleShape(Protocol):
    """What a kind's adapter knows about its objects' shape: where scale and template live."""

    @property
    def kind(self) -> str: ...

    def observe(self, target: WorkloadRef, obj: dict[str, Any]) -> ScaleState: ...

    def pod_spec(self, obj: dict[str, Any]) -> dict[str, Any]: ...


def parse_quantity(text: str) -> Decimal:
    """A Kubernetes quantity (`200Mi`, `1.5`, `250m`, `1e3`) as a number; ValueError if not one."""
    number, suffix = text, ""
    if len(text) >= 2 and text[-1] == "i" and text[-2] in _SUFFIX_EXPONENTS:
        number, suffix = text[:-2], text[-2:]
    elif text[-1:] in _SUFFIX_EXPONENTS:
        number, suffix = text[:-1], text[-1:]
    try:
        value = Decimal(number)
    except InvalidOperation as error:
        raise ValueError(f"Invalid number format: {number}") from error
    if not suffix:
        return value
    if suffix.endswith("i") and suffix[0] not in _BINARY_PREFIXES:
        # "ki", "mi", "ni" and "ui" are not binary suffixes
        raise ValueError(f"{text} has unknown suffix")
    base = 1024 if suffix.endswith("i") else 1000
    try:
        return value * (base ** Decimal(_SUFFIX_EXPONENTS[suffix[0]]))
    except DecimalException as error:
        raise ValueError(f"Invalid quantity: {text}") from error


def _quantity(value: Any) -> float:
    return float(parse_quantity(str(value)))


def resources_of(amounts: Mapping[str, Any] | None) -> Resources:
    amounts = amounts or {}
    return Resources(
        cpu=_quantity(amounts.get("cpu", 0)),
        memory=_quantity(amounts.get("memory", 0)),
        gpu=int(_quantity(amounts.get(GPU_RESOURCE, 0))),
    )


def pod_requests(spec: Mapping[str, Any]) -> Resources:
    """What the scheduler reserves: max(sum of containers, largest init container) + overhead."""
    containers = Resources()
    for container in spec.get("containers") or []:
        containers = containers + resources_of((container.get("resources") or {}).get("requests"))
    init_peak = Resources()
    sidecars = Resources()
    for container in spec.get("initContainers") or []:
        request = resources_of((container.get("resources") or {}).get("requests"))
        if container.get("restartPolicy") == "Always":
            sidecars = sidecars + request  # native sidecars run beside the containers
            continue
        init_peak = Resources(
            max(init_peak.cpu, request.cpu),
            max(init_peak.memory, request.memory),
            max(init_peak.gpu, request.gpu),
        )
    running = containers + sidecars
    total = Resources(
        max(running.cpu, init_peak.cpu),
        max(running.memory, init_peak.memory),
        max(running.gpu, init_peak.gpu),
    )
    return total + resources_of(spec.get("overhead"))


def pod_batch_requests(spec: Mapping[str, Any]) -> Resources:
    """What one pod borrows from serving's idle reservation: its containers' requests of
    tideshift.io/batch-cpu (millicores, returned as cores) and tideshift.io/batch-memory."""
    cpu = memory = 0.0
    for container in spec.get("containers") or []:
        amounts = (container.get("resources") or {}).get("requests") or {}
        cpu += _quantity(amounts.get(BATCH_CPU, 0)) / 1000.0
        memory += _quantity(amounts.get(BATCH_MEMORY, 0))
    return Resources(cpu=cpu, memory=memory)


def _timestamp(value: Any) -> float:
    if not value:
        return 0.0
    return datetime.fromisoformat(str(value).replace("Z", "+00:00")).timestamp()


def _condition(status: Mapping[str, Any], kind: str) -> bool:
    return any(
        condition.get("type") == kind and condition.get("status") == "True"
        for condition in status.get("conditions") or []
    )


def role_of(
    labels: Mapping[str, str], annotations: Mapping[str, str], owner: WorkloadRef | None
) -> Role:
    """The pod's role: label, then annotation `tideshift.io/role`, then the owner's kind."""
    for source in (labels, annotations):
        value = source.get(ROLE_LABEL)
        if value is None:
            continue
        if value in ROLES:
            return value  # type: ignore[return-value]
        log.warning("ignoring %s=%r: expected serving, training or other", ROLE_LABEL, value)
    if owner is not None and owner.kind in TRAINING_KINDS:
        return "training"
    return "other"


def node_from_object(obj: Mapping[str, Any]) -> Node:
    metadata = obj["metadata"]
    spec = obj.get("spec") or {}
    status = obj.get("status") or {}
    return Node(
        name=str(metadata["name"]),
        allocatable=resources_of(status.get("allocatable")),
        ready=_condition(status, "Ready"),
        unschedulable=bool(spec.get("unschedulable", False)),
        labels=tuple(sorted((metadata.get("labels") or {}).items())),
        resource_version=str(metadata.get("resourceVersion", "")),
    )


OwnerResolver = Callable[[str, Mapping[str, Any]], WorkloadRef | None]


def controller_reference(metadata: Mapping[str, Any]) -> Mapping[str, Any] | None:
    for reference in metadata.get("ownerReferences") or []:
        if reference.get("controller"):
            return dict(reference)
    return None


def direct_owner(namespace: str, reference: Mapping[str, Any]) -> WorkloadRef:
    """The controller itself, without following ReplicaSets to their Deployment."""
    return WorkloadRef(
        namespace=namespace,
        kind=qualified_kind(str(reference["kind"]), str(reference.get("apiVersion", ""))),
        name=str(reference["name"]),
    )


def pod_from_object(obj: Mapping[str, Any], resolve_owner: OwnerResolver) -> Pod:
    metadata = obj["metadata"]
    spec = obj.get("spec") or {}
    status = obj.get("status") or {}
    namespace = str(metadata["namespace"])
    labels: dict[str, str] = metadata.get("labels") or {}
    annotations: dict[str, str] = metadata.get("annotations") or {}
    reference = controller_reference(metadata)
    owner = resolve_owner(namespace, reference) if reference is not None else None
    raw_phase = status.get("phase") or "Pending"
    # "Unknown" (node lost contact) is not a state the planner can count on: treat as pending.
    phase = cast(PodPhase, raw_phase if raw_phase in PHASES else "Pending")
    return Pod(
        namespace=namespace,
        name=str(metadata["name"]),
        requests=pod_requests(spec),
        priority=int(spec.get("priority") or 0),
        owner=owner,
        role=role_of(labels, annotations, owner),
        phase=phase,
        node=spec.get("nodeName") or None,
        created_at=_timestamp(metadata.get("creationTimestamp")),
        ready=_condition(status, "Ready"),
        labels=tuple(sorted(labels.items())),
        uid=str(metadata.get("uid", "")),
        priority_class=spec.get("priorityClassName") or None,
        deleting=metadata.get("deletionTimestamp") is not None,
        resource_version=str(metadata.get("resourceVersion", "")),
    )


def workload_from_object(adapter: ScaleShape, obj: dict[str, Any]) -> Workload:
    """A labelled scale target: its scale and bounds (the adapter's), one replica's requests."""
    metadata = obj["metadata"]
    labels: dict[str, str] = metadata.get("labels") or {}
    label = labels.get(ROLE_LABEL)
    if label not in ("serving", "training"):
        raise ValueError(f"label {ROLE_LABEL}={label!r}: expected serving or training")
    role: Role = "serving" if label == "serving" else "training"
    ref = WorkloadRef(str(metadata["namespace"]), adapter.kind, str(metadata["name"]))
    annotations = tuple(sorted((metadata.get("annotations") or {}).items()))
    uid, version = str(metadata.get("uid", "")), str(metadata.get("resourceVersion", ""))
    try:
        hold = kueue_hold(obj)
        if hold is not None:
            raise UnsupportedTarget(hold)
        state = adapter.observe(ref, obj)
        pod_spec = adapter.pod_spec(obj)
        requests, batch_requests = pod_requests(pod_spec), pod_batch_requests(pod_spec)
    except UnsupportedTarget as error:  # its owner is told (the watcher's invalid policy)
        return Workload(
            ref=ref,
            role=role,
            replicas=0,
            ready_replicas=0,
            min_replicas=0,
            max_replicas=None,
            requests=Resources(),
            annotations=annotations,
            uid=uid,
            resource_version=version,
            unscalable=str(error),
        )
    return Workload(
        ref=ref,
        role=role,
        replicas=state.replicas,
        ready_replicas=state.ready_replicas,
        min_replicas=state.min_replicas,
        max_replicas=state.max_replicas,
        requests=requests,
        annotations=annotations,
        uid=uid,
        resource_version=version,
        batch_requests=batch_requests,
        held_by=kueue_size_owner(adapter.kind, obj) or "",
    )


Obj = TypeVar("Obj", Node, Pod, Workload)


def same_content(before: Node | Pod | Workload, after: Node | Pod | Workload) -> bool:
    """Equal in everything Tideshift reads (the resourceVersion alone does not count)."""
    return replace(before, resource_version="") == replace(after, resource_version="")


def diff(before: Mapping[str, Obj], after: Mapping[str, Obj]) -> list[ClusterChange]:
    """The changes that turn `before` into `after`, keyed alike; unchanged objects omitted."""
    changes: list[ClusterChange] = []
    for key, obj in after.items():
        old = before.get(key)
        if old is None:
            changes.append(ClusterChange("added", obj))
        elif not same_content(old, obj):
            changes.append(ClusterChange("modified", obj))
    changes.extend(ClusterChange("deleted", obj) for key, obj in before.items() if key not in after)
    return changes
