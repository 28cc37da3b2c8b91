"""The cluster snapshot as events: conversions from port objects and the KV key layout.

The snapshot bucket (`SNAPSHOT_BUCKET` in events/buckets.py by default) holds one key per
object, whose value is the latest `NodeChanged` or `PodChanged` for it:

* `node.<name>` for nodes,
* `pod.<namespace>.<name>` for pods,
* `workload.<namespace>.<kind>.<name>` for labelled workloads (`WorkloadChanged`),

each name encoded with `tideshift.events.encode_token` (dots in names become `_2E`). A planner that
starts late reads every key once and then follows the live subjects. Pure: no I/O.
"""

from __future__ import annotations

from datetime import datetime

from tideshift.events import (
    NodeChanged,
    PodChanged,
    Resources,
    WorkloadChanged,
    WorkloadRef,
    encode_token,
)
from tideshift.services.cluster.port import ChangeType, Node, Pod
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
