"""Where a pod goes and which pods leave first: the one packing model that the simulated
scheduler binds with, that the planner's feasibility check assumes, that the executor's
pod-deletion-cost marks follow, and that the `tideshift-packing` kube-scheduler profile
approximates (NodeResourcesFit `MostAllocated`, GPU weighted). Pure numpy; no I/O, no clock.

Rules, in order:

1. a pod goes only where its request fits the node's free room;
2. a pod that asks for no GPU goes to a node without GPUs while one fits: CPU-only pods on GPU
   nodes take the cores that GPU trainers need and strand the GPUs;
3. among those, the node that is most allocated once the pod is there wins (weights: cpu 1,
   memory 1, GPU 3; a resource the node does not have does not count), so pods pile onto
   nodes that are already busy and whole nodes stay free for large trainers;
4. ties go to the lower row (the caller's node order).
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]
BoolArray = npt.NDArray[np.bool_]

# cpu, memory, nvidia.com/gpu: the profile's NodeResourcesFit resource weights
RESOURCE_WEIGHTS = np.array([1.0, 1.0, 3.0])
_EPS = 1e-6


def fits(free: FloatArray, request: FloatArray) -> BoolArray:
    """Whether one pod of `request` (3,) fits each node's `free` room (nodes, 3)."""
    result: BoolArray = np.all(free + _EPS >= request, axis=1)
    return result


def fullness(used: FloatArray, allocatable: FloatArray) -> FloatArray:
    """MostAllocated's score per node in [0, 1]: the weighted mean of used / allocatable over
    the resources the node has (0 for a node with nothing allocatable)."""
    has = allocatable > 0
    ratios = np.divide(used, allocatable, out=np.zeros_like(used), where=has)
    weights = has * RESOURCE_WEIGHTS
    total = weights.sum(axis=1)
    score: FloatArray = np.divide(
        (ratios * weights).sum(axis=1), total, out=np.zeros(used.shape[0]), where=total > 0
    )
    return score


def placement_order(free: FloatArray, allocatable: FloatArray, request: FloatArray) -> IntArray:
    """Rows of the nodes one pod of `request` fits on, best first (the module's rules)."""
    candidates = np.flatnonzero(fits(free, request))
    if candidates.size == 0:
        return candidates.astype(np.int64)
    node_alloc = allocatable[candidates]
    score = fullness(node_alloc - free[candidates] + request, node_alloc)
    avoid = (
        (node_alloc[:, 2] > 0).astype(np.float64) if request[2] <= 0 else np.zeros(candidates.size)
    )
    # lexsort: last key first; stable, so ties keep the row order
    order = np.lexsort((-score, avoid))
    result: IntArray = candidates[order].astype(np.int64)
    return result


def best_node(free: FloatArray, allocatable: FloatArray, request: FloatArray) -> int | None:
    """The row one pod of `request` goes to, or None when it fits nowhere."""
    order = placement_order(free, allocatable, request)
    return int(order[0]) if order.size else None


def compact_down(
    counts: IntArray, rows: IntArray, row_count: int, keep: IntArray, node_rest: FloatArray
) -> IntArray:
    """Which pods stay when targets shrink, chosen so that scale-downs free whole nodes.

    Entries (rows[e], counts[e]) are one target's pods on one node, grouped by row in
    ascending order; `keep[row]` pods stay per target; `node_rest[e]` is how full entry e's
    node stays once that target's pods there are gone (`fullness`). Each target
    empties its entries in order of that fullness (the emptiest node first, then the entry
    with fewer pods, then the lower position), all of an entry's pods before the next's.
    Worked example (test_compact_down_frees_the_emptiest_node): counts [2, 3] on nodes that
    stay 0.5 and 0.0 full, keep 2: the second entry goes, [2, 0] stay.
    """
    if counts.size == 0:
        return counts.copy()
    totals = np.bincount(rows, weights=counts, minlength=row_count).astype(np.int64)
    remove = totals - np.clip(keep, 0, totals)
    order = np.lexsort((np.arange(counts.size), counts, node_rest, rows))
    ordered_rows, ordered_counts = rows[order], counts[order]
    running = np.cumsum(ordered_counts) - ordered_counts  # pods before, over all rows
    row_start = np.searchsorted(ordered_rows, np.arange(row_count))
    before = running - running[np.minimum(row_start, counts.size - 1)][ordered_rows]
    removed = np.clip(remove[ordered_rows] - before, 0, ordered_counts)
    stays = counts.copy()
    stays[order] = ordered_counts - removed
    result: IntArray = stays.astype(np.int64)
    return result


def entry_rest(
    used: FloatArray,
    allocatable: FloatArray,
    nodes: IntArray,
    counts: IntArray,
    requests: FloatArray,
) -> FloatArray:
    """`compact_down`'s node_rest: how full each entry's node stays without the entry's pods
    (`used`: requests per node now; `requests[e]`: one pod of entry e)."""
    if nodes.size == 0:
        return np.zeros(0)
    rest = np.maximum(used[nodes] - counts[:, None] * requests, 0.0)
    return fullness(rest, allocatable[nodes])
