"""Scale-down victims on a real cluster. Before a Deployment's replicas are lowered, the pods
whose removal frees whole nodes (`placement.compact_down`, the choice the plan assumed) get a low
`controller.kubernetes.io/pod-deletion-cost`, so the ReplicaSet controller deletes those first
and large trainers find empty nodes. Unbound and not-ready pods need no mark: the controller
deletes them before any ready one."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Protocol

import numpy as np

from tideshift.services.cluster.core.placement import compact_down, entry_rest
from tideshift.services.cluster.port import ClusterError, Node, Pod, WorkloadRef

log = logging.getLogger("tideshift.executor")

# Below the default (0) of every unmarked pod; pods marked earlier and still there are marked
# again or left to a later scale-down.
VICTIM_COST = -1000
# Kinds whose controller (a ReplicaSet) honours the annotation.
COMPACTED_KINDS = frozenset({"Deployment.apps"})


class ClusterListing(Protocol):
    """Nodes and pods as the cluster has them now: what packing decisions start from."""

    async def list_nodes(self) -> list[Node]: ...

    async def list_pods(self) -> list[Pod]: ...


class DeletionCostWriter(Protocol):
    async def set_deletion_cost(self, namespace: str, name: str, cost: int) -> None: ...


def scale_down_victims(
    pods: Sequence[Pod], nodes: Sequence[Node], target: WorkloadRef, keep: int
) -> list[Pod]:
    """The ready pods of `target` to delete so that `keep` remain, emptiest nodes first.

    Pods that are unbound, not ready or already terminating leave first anyway and count
    towards the removals."""
    live = [pod for pod in pods if not pod.deleting]
    mine = [pod for pod in live if pod.owner == target]
    remove = len(mine) - max(keep, 0)
    ready = [pod for pod in mine if pod.node is not None and pod.ready]
    remove -= len(mine) - len(ready)  # the controller takes those before any ready pod
    if remove <= 0 or not ready:
        return []
    row_of = {node.name: row for row, node in enumerate(nodes)}
    allocatable = np.array([node.allocatable.vector() for node in nodes]).reshape(-1, 3)
    by_node: dict[str, list[Pod]] = {}
    for pod in ready:
        if pod.node in row_of:
            by_node.setdefault(pod.node, []).append(pod)
    # Only the nodes holding the target's pods are weighed (entry_rest reads no other row):
    # the rest of the cluster's pods cost a membership test each, not a numpy addition.
    used = np.zeros_like(allocatable)
    for pod in live:
        if pod.node in by_node:
            used[row_of[pod.node]] += pod.requests.vector()
    names = sorted(by_node)
    node_rows = np.array([row_of[name] for name in names], dtype=np.int64)
    counts = np.array([len(by_node[name]) for name in names], dtype=np.int64)
    request = np.array([by_node[name][0].requests.vector() for name in names]).reshape(-1, 3)
    rest = entry_rest(used, allocatable, node_rows, counts, request)
    stays = compact_down(
        counts,
        np.zeros(len(names), dtype=np.int64),
        1,
        np.array([int(counts.sum()) - remove], dtype=np.int64),
        lambda mask: rest[mask],
    )
    victims: list[Pod] = []
    for name, count, stay in zip(names, counts.tolist(), stays.tolist(), strict=True):
        newest_first = sorted(by_node[name], key=lambda pod: pod.created_at, reverse=True)
        victims += newest_first[: count - stay]
    return victims


async def mark_scale_down_victims(
    port: ClusterListing, writer: DeletionCostWriter, target: WorkloadRef, keep: int
) -> int:
    """Mark the victims of lowering `target` to `keep` replicas; how many were marked. A pod
    that is gone meanwhile is skipped; a failed mark only costs packing, so it is logged and
    the scale-down goes on."""
    if target.kind not in COMPACTED_KINDS:
        return 0
    victims = scale_down_victims(await port.list_pods(), await port.list_nodes(), target, keep)
    marked = 0
    for pod in victims:
        try:
            await writer.set_deletion_cost(pod.namespace, pod.name, VICTIM_COST)
        except KeyError:
            continue
        except ClusterError as error:
            log.warning("could not mark %s for deletion first: %s", pod.key, error)
            continue
        marked += 1
    return marked
