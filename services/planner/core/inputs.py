"""Turns cluster state, targets and forecasts into the policy's `PlanInputs` (wiring, not
policy); pure: no I/O, no clock, nothing but the cluster port's value types."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from tideshift.services.cluster.port import Node, Resources
from tideshift.services.planner.core import (
    ClusterView,
    Forecast,
    NodeSpec,
    PlanInputs,
    PodSpec,
    PolicyConfig,
    ServingWorkload,
    Target,
    TrainingJob,
)


def node_spec(node: Node) -> NodeSpec:
    return NodeSpec(node.name, node.allocatable.vector(), node.schedulable)


def pod_spec(
    node: str | None, requests: Resources, owner: Target | None, *, companion: bool
) -> PodSpec:
    """A pod row for `ClusterView.build`; a job's companions are not among its replicas."""
    return PodSpec(requests.vector(), node, owner, not companion)


def live_replicas(view: ClusterView) -> dict[Target, int]:
    """Replica pods (bound or not) per owner in the view."""
    replicas = view.pod_owner[view.pod_replica & (view.pod_owner >= 0)]
    per_owner = np.bincount(replicas, minlength=len(view.owners))
    return {owner: int(per_owner[row]) for row, owner in enumerate(view.owners)}


def plan_inputs(
    view: ClusterView,
    serving: tuple[ServingWorkload, ...],
    jobs: tuple[TrainingJob, ...],
    forecasts: Mapping[Target, Forecast],
    *,
    wanted: Mapping[Target, int],
    config: PolicyConfig | None = None,
    cluster_stale: bool = False,
    observed_rps: Mapping[Target, float] | None = None,
) -> PlanInputs:
    """The one way from cluster state, targets and forecasts to `PlanInputs`.

    A managed target's current count is what it is known to want (`wanted`: its spec, or our
    last confirmed command), else its live replica pods.
    """
    live = live_replicas(view)
    managed = [w.target for w in serving] + [j.target for j in jobs]
    return PlanInputs(
        cluster=view,
        serving=serving,
        jobs=jobs,
        forecasts=forecasts,
        current={t: wanted[t] if t in wanted else live.get(t, 0) for t in managed},
        config=config if config is not None else PolicyConfig(),
        cluster_stale=cluster_stale,
        observed_rps=observed_rps if observed_rps is not None else {},
    )


# Rows of removed nodes and of owners with no live pod are dropped once there are this many
# (and more than the live ones): names from outside cannot grow the table without bound.
COMPACT_AFTER = 1024


class ClusterTable:
    """The cluster as growable columnar arrays, updated one object at a time.

    The planner service applies each node/pod event in O(1) and takes a `ClusterView` per
    plan with a few array copies, instead of rebuilding 150,000 records every time. Rows of
    removed pods are recycled; a node that is removed (or only known from a pod's binding so
    far) keeps its row with zero allocatable until the rows of removed nodes no live pod is
    bound to are dropped together (as are owners no live pod has).
    """

    def __init__(self, pod_capacity: int = 1024) -> None:
        self._node_row: dict[str, int] = {}
        self._node_names: list[str] = []
        self._allocatable = np.zeros((16, 3))
        self._owner_row: dict[Target, int] = {}
        self._owners: list[Target] = []
        self._removed: set[str] = set()  # names of removed nodes that still have a row
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
        row = self._node(name)  # first: it may grow (replace) the array assigned into
        self._allocatable[row] = allocatable if schedulable else (0.0, 0.0, 0.0)
        self._removed.discard(name)

    def remove_node(self, name: str) -> None:
        row = self._node_row.get(name)
        if row is not None:
            self._allocatable[row] = 0.0
            self._removed.add(name)
            if len(self._removed) > max(COMPACT_AFTER, len(self._node_names) // 2):
                self._compact_nodes()

    def _compact_nodes(self) -> None:
        """Drop the rows of removed nodes no live pod is bound to; pods follow their rows."""
        size = self._size
        bound = self._pod_node[:size][self._pod_live[:size]]
        held = set(bound[bound >= 0].tolist())
        keep = [r for r, n in enumerate(self._node_names) if n not in self._removed or r in held]
        new_row = np.full(len(self._node_names) + 1, -1, dtype=np.int64)  # [-1] stays -1
        new_row[keep] = np.arange(len(keep))
        self._pod_node[:size] = new_row[self._pod_node[:size]]
        self._node_names = [self._node_names[row] for row in keep]
        self._node_row = {name: row for row, name in enumerate(self._node_names)}
        self._allocatable[: len(keep)] = self._allocatable[keep]
        self._allocatable[len(keep) :] = 0.0
        self._removed &= self._node_row.keys()

    def _compact_owners(self) -> None:
        """Drop the owners no live pod has; pods follow their rows."""
        size = self._size
        owned = self._pod_owner[:size][self._pod_live[:size]]
        keep = sorted(set(owned[owned >= 0].tolist()))
        new_row = np.full(len(self._owners) + 1, -1, dtype=np.int64)  # [-1] stays -1
        new_row[keep] = np.arange(len(keep))
        self._pod_owner[:size] = new_row[self._pod_owner[:size]]
        self._owners = [self._owners[row] for row in keep]
        self._owner_row = {owner: row for row, owner in enumerate(self._owners)}

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
                if len(self._owners) > max(COMPACT_AFTER, 2 * len(self._pod_row)):
                    self._compact_owners()
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
