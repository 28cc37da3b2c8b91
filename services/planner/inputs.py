"""Turns the cluster port's objects into the policy's columnar inputs (wiring, not policy)."""

from __future__ import annotations

from collections.abc import Iterable
from functools import lru_cache

import numpy as np

from services.cluster.port import Node, Pod, Resources, TargetRef
from services.planner.policy import ClusterView, Target

COMPANION_LABEL = "tideshift.io/companion"


@lru_cache(maxsize=65_536)
def to_target(ref: TargetRef) -> Target:
    return Target(ref.namespace, ref.kind, ref.name)


def to_ref(target: Target) -> TargetRef:
    return TargetRef(target.namespace, target.kind, target.name)


def vector(resources: Resources) -> tuple[float, float, float]:
    return (resources.cpu, resources.memory, float(resources.gpu))


def is_companion(pod: Pod) -> bool:
    """A job's fixed helper (parameter server, coordinator): not one of its scaled replicas."""
    return any(key == COMPANION_LABEL and value == "true" for key, value in pod.labels)


def build_view(
    nodes: Iterable[Node],
    pods: Iterable[tuple[str | None, Resources, TargetRef | None, bool]],
) -> ClusterView:
    """Pods as (node, requests, owner, companion) rows; unready nodes get no capacity."""
    node_list = list(nodes)
    node_row = {node.name: row for row, node in enumerate(node_list)}
    allocatable = np.zeros((len(node_list), 3))
    for row, node in enumerate(node_list):
        if node.schedulable:
            allocatable[row] = vector(node.allocatable)
    owner_row: dict[TargetRef, int] = {}
    pod_node: list[int] = []
    requests: list[tuple[float, float, float]] = []
    owners: list[int] = []
    replica: list[bool] = []
    for node_name, resources, owner, companion in pods:
        pod_node.append(-1 if node_name is None else node_row.get(node_name, -1))
        requests.append((resources.cpu, resources.memory, float(resources.gpu)))
        owners.append(-1 if owner is None else owner_row.setdefault(owner, len(owner_row)))
        replica.append(not companion)
    return ClusterView(
        node_names=tuple(node.name for node in node_list),
        allocatable=allocatable,
        owners=tuple(to_target(ref) for ref in owner_row),
        pod_node=np.array(pod_node, dtype=np.int64),
        pod_requests=np.array(requests, dtype=np.float64).reshape(-1, 3),
        pod_owner=np.array(owners, dtype=np.int64),
        pod_replica=np.array(replica, dtype=np.bool_),
    )


def view_from_port_objects(nodes: Iterable[Node], pods: Iterable[Pod]) -> ClusterView:
    live = (
        (pod.node, pod.requests, pod.owner, is_companion(pod))
        for pod in pods
        if pod.phase in ("Pending", "Running")
    )
    return build_view(nodes, live)
