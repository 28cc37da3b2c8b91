"""Per-node packing: how many pods of a shape fit where, first-fit placement, shrinking a
workload from the nodes that hold most of it, and the cluster's pods as sparse per-node entries
of the managed targets. Pure numpy; no I/O."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from tideshift.services.planner.policy.model import (
    FloatArray,
    IntArray,
    PlanInputs,
    Target,
)


def slots_per_node(free: FloatArray, request: FloatArray) -> IntArray:
    """How many pods of `request` fit on each node's free resources."""
    positive = request > 0
    if not positive.any():
        return np.full(free.shape[0], 1 << 30, dtype=np.int64)
    ratios = np.floor((free[:, positive] + 1e-6) / request[positive])
    slots: IntArray = np.maximum(ratios.min(axis=1), 0).astype(np.int64)
    return slots


def pack_sparse(free: FloatArray, request: FloatArray, count: int) -> tuple[IntArray, IntArray]:
    """First fit of `count` identical pods: (node rows, pods on each); the sum may fall short.

    Scans nodes in growing blocks and stops once everything is placed: small additions on a
    big cluster touch only the first few hundred nodes.
    """
    node_count = free.shape[0]
    nodes: list[IntArray] = []
    counts: list[IntArray] = []
    start, block = 0, 256
    while count > 0 and start < node_count:
        end = min(node_count, start + block)
        slots = slots_per_node(free[start:end], request)
        before = np.cumsum(slots) - slots
        taken = np.clip(count - before, 0, slots)
        used = np.flatnonzero(taken)
        nodes.append(used + start)
        counts.append(taken[used])
        count -= int(taken.sum())
        start, block = end, block * 2
    if not nodes:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    return np.concatenate(nodes), np.concatenate(counts)


def level_down(counts: IntArray, keep: int) -> IntArray:
    """Keep `keep` pods, removing first from the nodes that hold the most."""
    total = int(counts.sum())
    if keep >= total:
        return counts
    if keep <= 0:
        return np.zeros(counts.shape, dtype=np.int64)
    low, high = 0, int(counts.max())
    while low < high:  # largest cap h with sum(min(counts, h)) <= keep
        middle = (low + high + 1) // 2
        if int(np.minimum(counts, middle).sum()) <= keep:
            low = middle
        else:
            high = middle - 1
    kept = np.minimum(counts, low)
    remainder = keep - int(kept.sum())
    if remainder > 0:
        above = np.flatnonzero(counts > low)[:remainder]
        kept[above] += 1
    return kept


def level_down_many(counts: IntArray, rows: IntArray, row_count: int, keep: IntArray) -> IntArray:
    """`level_down` for many targets at once.

    Entries (rows[e], counts[e]) are one target's pods on one node, grouped by row in
    ascending order; `keep[row]` pods stay per target. A vectorised binary search finds each
    target's cap h (largest with sum(min(counts, h)) <= keep); the remainder goes, one each,
    to that target's first entries above h. Worked example (test_level_down_many): counts
    [4, 1, 2] with keep 5 gives h = 2, sum 5, stays [2, 1, 2].
    """
    if counts.size == 0:
        return counts.copy()
    totals = np.bincount(rows, weights=counts, minlength=row_count).astype(np.int64)
    keep = np.clip(keep, 0, totals)
    cut = keep < totals
    if not cut.any():
        return counts.copy()
    affected = cut[rows]
    if not affected.all():  # only the targets that shrink need the search
        result_all = counts.copy()
        result_all[affected] = level_down_many(counts[affected], rows[affected], row_count, keep)
        return result_all
    low = np.zeros(row_count, dtype=np.int64)
    high = np.zeros(row_count, dtype=np.int64)
    np.maximum.at(high, rows, counts)
    for _ in range(64):
        if np.all(low >= high):
            break
        middle = (low + high + 1) // 2
        sums = np.bincount(rows, weights=np.minimum(counts, middle[rows]), minlength=row_count)
        fits = sums <= keep + 1e-9
        low = np.where(fits, middle, low)
        high = np.where(fits, high, middle - 1)
    stays = np.minimum(counts, low[rows])
    remainder = keep - np.bincount(rows, weights=stays, minlength=row_count).astype(np.int64)
    above = counts > low[rows]
    running = np.cumsum(above)
    starts = np.searchsorted(rows, np.arange(row_count))
    before_row = np.where(starts > 0, running[np.maximum(starts - 1, 0)], 0)
    rank = running - 1 - before_row[rows]
    stays += (above & (rank < remainder[rows])).astype(np.int64)
    result: IntArray = stays
    return result


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
