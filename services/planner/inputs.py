"""Turns the cluster port's objects into the policy's columnar inputs (wiring, not policy)."""

from __future__ import annotations

from collections.abc import Iterable
from functools import lru_cache

import numpy as np

from tideshift.services.cluster.port import Node, Pod, Resources, TargetRef
from tideshift.services.planner.policy import ClusterView, Target


@lru_cache(maxsize=65_536)
def to_target(ref: TargetRef) -> Target:
    return Target(ref.namespace, ref.kind, ref.name)


def to_ref(target: Target) -> TargetRef:
    return TargetRef(target.namespace, target.kind, target.name)


def vector(resources: Resources) -> tuple[float, float, float]:
    return (resources.cpu, resources.memory, float(resources.gpu))


def is_companion(pod: Pod) -> bool:
    """A job's fixed helper (parameter server, coordinator): not one of its scaled replicas."""
    return pod.companion


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


class ClusterTable:
    """The cluster as growable columnar arrays, updated one object at a time.

    The planner service applies each node/pod event in O(1) and takes a `ClusterView` per
    plan with a few array copies, instead of rebuilding 150,000 records every time. Rows of
    removed pods are recycled; a node that is removed (or only known from a pod's binding so
    far) keeps its row with zero allocatable.
    """

    def __init__(self, pod_capacity: int = 1024) -> None:
        self._node_row: dict[str, int] = {}
        self._node_names: list[str] = []
        self._allocatable = np.zeros((16, 3))
        self._owner_row: dict[Target, int] = {}
        self._owners: list[Target] = []
        self._pod_row: dict[tuple[str, str], int] = {}
        self._free_rows: list[int] = []
        self._size = 0
        self._pod_node = np.full(pod_capacity, -1, dtype=np.int64)
        self._pod_requests = np.zeros((pod_capacity, 3))
        self._pod_owner = np.full(pod_capacity, -1, dtype=np.int64)
        self._pod_replica = np.zeros(pod_capacity, dtype=np.bool_)
        self._pod_live = np.zeros(pod_capacity, dtype=np.bool_)

    def __len__(self) -> int:
        return len(self._pod_row)

    def _node(self, name: str) -> int:
        row = self._node_row.get(name)
        if row is None:
            row = len(self._node_names)
            self._node_row[name] = row
            self._node_names.append(name)
            if row >= len(self._allocatable):
                grown = np.zeros((2 * len(self._allocatable), 3))
                grown[: len(self._allocatable)] = self._allocatable
                self._allocatable = grown
        return row

    def upsert_node(
        self, name: str, allocatable: tuple[float, float, float], *, schedulable: bool
    ) -> None:
        self._allocatable[self._node(name)] = allocatable if schedulable else (0.0, 0.0, 0.0)

    def remove_node(self, name: str) -> None:
        row = self._node_row.get(name)
        if row is not None:
            self._allocatable[row] = 0.0

    def upsert_pod(
        self,
        key: tuple[str, str],
        *,
        node: str | None,
        requests: tuple[float, float, float],
        owner: Target | None,
        replica: bool,
    ) -> None:
        row = self._pod_row.get(key)
        if row is None:
            row = self._free_rows.pop() if self._free_rows else self._append_row()
            self._pod_row[key] = row
        self._pod_node[row] = -1 if node is None else self._node(node)
        self._pod_requests[row] = requests
        if owner is None:
            self._pod_owner[row] = -1
        else:
            owner_row = self._owner_row.get(owner)
            if owner_row is None:
                owner_row = self._owner_row[owner] = len(self._owners)
                self._owners.append(owner)
            self._pod_owner[row] = owner_row
        self._pod_replica[row] = replica
        self._pod_live[row] = True

    def remove_pod(self, key: tuple[str, str]) -> None:
        row = self._pod_row.pop(key, None)
        if row is not None:
            self._pod_live[row] = False
            self._free_rows.append(row)

    def _append_row(self) -> int:
        if self._size == len(self._pod_node):
            capacity = 2 * len(self._pod_node)
            self._pod_node = np.resize(self._pod_node, capacity)
            self._pod_requests = np.resize(self._pod_requests, (capacity, 3))
            self._pod_owner = np.resize(self._pod_owner, capacity)
            self._pod_replica = np.resize(self._pod_replica, capacity)
            live = np.zeros(capacity, dtype=np.bool_)
            live[: self._size] = self._pod_live[: self._size]
            self._pod_live = live
        self._size += 1
        return self._size - 1

    def view(self) -> ClusterView:
        live = self._pod_live[: self._size]
        node_count = len(self._node_names)
        return ClusterView(
            node_names=tuple(self._node_names),
            allocatable=self._allocatable[:node_count].copy(),
            owners=tuple(self._owners),
            pod_node=self._pod_node[: self._size][live],
            pod_requests=self._pod_requests[: self._size][live],
            pod_owner=self._pod_owner[: self._size][live],
            pod_replica=self._pod_replica[: self._size][live],
        )
