"""Per-node packing: how many pods of a shape fit where, placement as the scheduler packs and
which pods leave when a target shrinks (both `cluster.core.placement`, shared with the simulator and
the executor), stranded capacity, and the cluster's pods as sparse per-node entries of the
managed targets. Pure numpy; no I/O."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from tideshift.services.cluster.core.placement import fits, placement_key
from tideshift.services.planner.core.model import (
    FloatArray,
    IntArray,
    PlanInputs,
    Target,
)

# Slack when room is compared with requests (a millionth of a core, a byte, a GPU): looser than
# `EPS` (services/core/constants.py) on purpose. Room is a difference of sums over many pods,
# and a pod that fits must not be refused for their rounding; every packing and admission rule
# of the planner compares room with this one slack.
ROOM_SLACK = 1e-6


def slots_per_node(free: FloatArray, request: FloatArray) -> IntArray:
    """How many pods of `request` fit on each node's free resources."""
    positive = request > 0
    if not positive.any():
        return np.full(free.shape[0], 1 << 30, dtype=np.int64)
    ratios = np.floor((free[:, positive] + ROOM_SLACK) / request[positive])
    slots: IntArray = np.maximum(ratios.min(axis=1), 0).astype(np.int64)
    return slots


def pack_sparse(
    free: FloatArray, request: FloatArray, count: int, allocatable: FloatArray
) -> tuple[IntArray, IntArray]:
    """Place `count` identical pods as the scheduler would (`cluster.core.placement`: CPU-only pods
    off GPU nodes while others fit, then the most allocated node first): (node rows, pods on
    each); the sum may fall short.

    A pod only makes its node fuller, so the node that wins the first pod wins the following
    ones until it is full: filling nodes in the first pod's order is the scheduler's outcome.
    At most `count` nodes are needed, so only the best `count` keys (and their ties) are sorted.
    """
    empty = np.zeros(0, dtype=np.int64)
    if count <= 0:
        return empty, empty
    key = placement_key(free, allocatable, request)
    fitting = int(np.count_nonzero(np.isfinite(key)))
    if fitting == 0:
        return empty, empty
    if count < fitting:
        threshold = np.partition(key, count - 1)[count - 1]
        near = np.flatnonzero(key <= threshold)
        order = near[np.argsort(key[near], kind="stable")]
    else:
        order = np.argsort(key, kind="stable")[:fitting]
    slots = slots_per_node(free[order], request)
    before = np.cumsum(slots) - slots
    taken = np.clip(count - before, 0, slots)
    used = np.flatnonzero(taken)
    nodes: IntArray = order[used].astype(np.int64)
    counts: IntArray = taken[used].astype(np.int64)
    return nodes, counts


def stranded_capacity(free: FloatArray, shapes: FloatArray) -> FloatArray:
    """Fragmentation: the free (cpu, memory, GPU) summed over nodes where not one pod of any
    pending training shape (`shapes`, (k, 3)) fits. Nothing pending strands nothing."""
    if shapes.size == 0 or free.size == 0:
        return np.zeros(3)
    fits_any = np.zeros(free.shape[0], dtype=np.bool_)
    for shape in shapes.reshape(-1, 3):
        fits_any |= fits(free, shape)
    stranded: FloatArray = np.maximum(free[~fits_any], 0.0).sum(axis=0)
    return stranded


def node_sums(
    nodes: IntArray, weights: IntArray, requests: FloatArray, node_count: int
) -> FloatArray:
    """Per-node resources of `weights[e]` pods of `requests[e]` on `nodes[e]`: (nodes, 3)."""
    result = np.zeros((node_count, 3))
    if nodes.size:
        for resource in range(3):
            result[:, resource] = np.bincount(
                nodes, weights=weights * requests[:, resource], minlength=node_count
            )
    return result


def managed_targets(inputs: PlanInputs) -> list[Target]:
    """Serving workloads then jobs: the row order of `cluster_usage`'s counts."""
    return [w.target for w in inputs.serving] + [j.target for j in inputs.jobs]


@dataclass(frozen=True, slots=True, eq=False)
class ClusterEntries:
    """Requests of pods the plan does not scale, per node, and bound replicas of each managed
    target (rows: serving workloads, then jobs) as sparse (row, node, count) entries sorted by
    row then node."""

    fixed: FloatArray  # (nodes, 3)
    row: IntArray
    node: IntArray
    count: IntArray
    row_totals: IntArray  # (managed,)


def cluster_entries(inputs: PlanInputs) -> ClusterEntries:
    view = inputs.cluster
    node_count = len(view.node_names)
    managed = managed_targets(inputs)
    managed_row = {target: row for row, target in enumerate(managed)}
    # owner index (+1 so that "unowned" -1 maps to slot 0) -> managed row or -1
    owner_to_managed = np.full(len(view.owners) + 1, -1, dtype=np.int64)
    for owner_index, owner in enumerate(view.owners):
        owner_to_managed[owner_index + 1] = managed_row.get(owner, -1)
    pod_managed = owner_to_managed[view.pod_owner + 1]
    bound = view.pod_node >= 0
    managed_replica = (pod_managed >= 0) & view.pod_replica
    fixed_mask = bound & ~managed_replica
    fixed = np.zeros((node_count, 3))
    fixed_nodes = view.pod_node[fixed_mask]
    fixed_requests = view.pod_requests[fixed_mask]
    for resource in range(3):
        fixed[:, resource] = np.bincount(
            fixed_nodes, weights=fixed_requests[:, resource], minlength=node_count
        )[:node_count]
    counted = bound & managed_replica
    keys = np.sort(pod_managed[counted] * max(node_count, 1) + view.pod_node[counted])
    if keys.size:
        starts = np.flatnonzero(np.r_[True, keys[1:] != keys[:-1]])
        unique = keys[starts]
        count = np.diff(np.r_[starts, keys.size]).astype(np.int64)
    else:
        unique = count = np.zeros(0, dtype=np.int64)
    row = unique // max(node_count, 1)
    totals = np.bincount(row, weights=count, minlength=len(managed)).astype(np.int64)
    return ClusterEntries(fixed, row, unique % max(node_count, 1), count, totals)


def cluster_usage(inputs: PlanInputs) -> tuple[FloatArray, IntArray]:
    """(requests per node of pods the plan does not scale, bound replicas per managed target
    per node, dense). For small clusters (the baselines); the policy uses `cluster_entries`."""
    entries = cluster_entries(inputs)
    counts = np.zeros((len(managed_targets(inputs)), entries.fixed.shape[0]), dtype=np.int64)
    counts[entries.row, entries.node] = entries.count
    return entries.fixed, counts


def reserve_pending_companions(
    inputs: PlanInputs, entries: ClusterEntries, free: FloatArray
) -> FloatArray:
    """`free` less the room a managed job's companions waiting for a node (a new job's
    parameter servers) will take: placed as the scheduler would, in room no trainer holds
    first, then where they preempt trainers. Without it a newcomer's trainers would get room
    its parameter servers then lack, and the job would not start."""
    view = inputs.cluster
    managed = set(managed_targets(inputs))
    # One slot more for pods without an owner (index -1).
    owned_by_managed = np.array([owner in managed for owner in view.owners] + [False])
    waiting = (view.pod_node < 0) & ~view.pod_replica & owned_by_managed[view.pod_owner]
    if not waiting.any():
        return free
    serving_count = len(inputs.serving)
    is_job = entries.row >= serving_count
    job_requests = np.array(
        [job.trainer_requests for job in inputs.jobs], dtype=np.float64
    ).reshape(-1, 3)
    trainer_use = node_sums(
        entries.node[is_job],
        entries.count[is_job],
        job_requests[entries.row[is_job] - serving_count],
        free.shape[0],
    )
    reserved = free.copy()
    shapes, counts = np.unique(view.pod_requests[waiting], axis=0, return_counts=True)
    for shape, count in zip(shapes, counts.tolist(), strict=True):
        rest = count
        for room in (reserved - trainer_use, reserved):
            nodes, placed = pack_sparse(room, shape, rest, view.allocatable)
            reserved[nodes] -= placed[:, None] * shape
            rest -= int(placed.sum())
            if rest <= 0:
                break
    return reserved
