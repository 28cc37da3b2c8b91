"""The cluster snapshot as events: conversions from port objects and the KV key layout.

The snapshot bucket (`SNAPSHOT_BUCKET` in events/buckets.py by default) holds one key per
object, whose value is the latest `NodeChanged` or `PodChanged` for it:

* `node.<name>` for nodes,
* `pod.<namespace>.<name>` for pods,
* `workload.<namespace>.<kind>.<name>` for labelled workloads (`WorkloadChanged`),

each name encoded with `tideshift.events.encode_token` (dots in names become `_2E`). A planner that
starts late reads every key once and then follows the live subjects. Pure: no I/O.

Changes are ordered by the apiserver's resourceVersion (`VersionOrder`), never by a clock: a
watcher's or a producer's clock can be wrong, the apiserver's counter cannot go back.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field
from datetime import datetime

from tideshift.events import (
    NodeChanged,
    PodChanged,
    Resources,
    WorkloadChanged,
    WorkloadRef,
    encode_token,
)
from tideshift.services.cluster.port import ChangeType, Node, Pod, Workload
from tideshift.services.cluster.port import Resources as PortResources


def node_key(name: str) -> str:
    return f"node.{encode_token(name)}"


def pod_key(namespace: str, name: str) -> str:
    return f"pod.{encode_token(namespace)}.{encode_token(name)}"


def workload_key(ref: WorkloadRef) -> str:
    parts = (ref.namespace, ref.kind, ref.name)
    return "workload." + ".".join(encode_token(part) for part in parts)


def _resources(amount: PortResources) -> Resources:
    return Resources(cpu=max(amount.cpu, 0.0), memory=max(amount.memory, 0.0), gpu=amount.gpu)


def node_event(change: ChangeType, node: Node, *, observed_at: datetime) -> NodeChanged:
    return NodeChanged(
        change=change,
        name=node.name,
        allocatable=_resources(node.allocatable),
        labels=dict(node.labels),
        ready=node.ready,
        unschedulable=node.unschedulable,
        resource_version=node.resource_version,
        observed_at=observed_at,
    )


def pod_event(change: ChangeType, pod: Pod, *, observed_at: datetime) -> PodChanged:
    return PodChanged(
        change=change,
        namespace=pod.namespace,
        name=pod.name,
        uid=pod.uid,
        phase=pod.phase,
        node=pod.node,
        priority=pod.priority,
        priority_class=pod.priority_class,
        owner=pod.owner,
        role=pod.role,
        companion=pod.companion,
        requests=_resources(pod.requests),
        deleting=pod.deleting,
        resource_version=pod.resource_version,
        observed_at=observed_at,
    )


def same_state(
    before: NodeChanged | PodChanged | WorkloadChanged,
    after: NodeChanged | PodChanged | WorkloadChanged,
) -> bool:
    """Equal apart from bookkeeping (change type, observation time, resourceVersion)."""
    ignore = {"change", "observed_at", "resource_version"}
    return type(before) is type(after) and before.model_dump(exclude=ignore) == after.model_dump(
        exclude=ignore
    )


def version_number(resource_version: str) -> int | None:
    """The resourceVersion as a number, None when it cannot be ordered.

    An etcd-backed apiserver stamps every write with the store's one revision counter, so a
    larger version is a later state of the cluster; versions are compared as integers, as
    Kubernetes' own comparable-resource-version check does. "" (the simulated cluster) and
    anything non-numeric are not ordered: such changes are taken in arrival order.
    """
    return int(resource_version) if resource_version.isdecimal() else None


@dataclass
class VersionOrder:
    """Per key, the newest resourceVersion taken: an older change is dropped, and a deletion
    wins over any add at or before its version (a replayed or late add cannot bring a deleted
    object back). Deletions are remembered as tombstones, at most `tombstone_limit` of them
    (the oldest forgotten first), so a flood of deleted names cannot grow it without bound;
    live keys are bounded by what the cluster holds."""

    tombstone_limit: int = 10_000
    live: dict[str, int] = field(default_factory=dict)
    tombstones: OrderedDict[str, int] = field(default_factory=OrderedDict)

    def admit(self, key: str, change: ChangeType, resource_version: str) -> bool:
        """Whether this change is newer than what was taken for `key` (and record it)."""
        version = version_number(resource_version)
        deleted_at = self.tombstones.get(key)
        if version is not None:
            newest = max(self.live.get(key, -1), -1 if deleted_at is None else deleted_at)
            stale = version < newest or (change != "deleted" and deleted_at == version)
            if stale:
                return False
        if change == "deleted":
            self.live.pop(key, None)
            if version is not None:
                self.tombstones[key] = version
                self.tombstones.move_to_end(key)
                while len(self.tombstones) > self.tombstone_limit:
                    self.tombstones.popitem(last=False)
            return True
        self.tombstones.pop(key, None)
        if version is None:
            self.live.pop(key, None)
        else:
            self.live[key] = version
        return True


def older(resource_version: str, than: str) -> bool:
    """Whether a state is known to be earlier than another (both versions ordered)."""
    version, other = version_number(resource_version), version_number(than)
    return version is not None and other is not None and version < other


def object_key(obj: Node | Pod | Workload) -> str:
    """The snapshot key of a port object."""
    if isinstance(obj, Node):
        return node_key(obj.name)
    if isinstance(obj, Workload):
        return workload_key(obj.ref)
    return pod_key(obj.namespace, obj.name)
