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

Scale-downs mirror rule 2: a target's pods without GPUs leave GPU nodes first, then the pods
whose node stays emptiest once they are gone (`removal_key`), so CPU trainers do not sit on
the cores a GPU gang is waiting for while CPU nodes keep room.
"""

from __future__ import annotations

from collections.abc import Callable

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
    # column by column: numpy reduces a (nodes, 3) array along its short axis slowly
    result: BoolArray = free[:, 0] + _EPS >= request[0]
    for resource in (1, 2):
        result &= free[:, resource] + _EPS >= request[resource]
    return result


def fullness(used: FloatArray, allocatable: FloatArray) -> FloatArray:
    """MostAllocated's score per node in [0, 1]: the weighted mean of used / allocatable over
    the resources the node has (0 for a node with nothing allocatable)."""
    nodes = used.shape[0]
    weighted = np.zeros(nodes)
    weights = np.zeros(nodes)
    for resource, weight in enumerate(RESOURCE_WEIGHTS.tolist()):
        capacity = allocatable[:, resource]
        has = capacity > 0
        if not has.any():
            continue  # no node has this resource (GPUs on a CPU cluster)
        weighted += weight * has * used[:, resource] / np.where(has, capacity, 1.0)
        weights += weight * has
    score: FloatArray = weighted / np.maximum(weights, 1e-12)
    return score


def placement_key(free: FloatArray, allocatable: FloatArray, request: FloatArray) -> FloatArray:
    """Per node, the rules as one sort key (lower is better): +inf where one pod of
    `request` does not fit; 2 added to GPU nodes for a pod without GPUs; minus the node's
    fullness once the pod is there."""
    key = -fullness(allocatable - free + request, allocatable)
    if request[2] <= 0:
        key += 2.0 * (allocatable[:, 2] > 0)
    result: FloatArray = np.where(fits(free, request), key, np.inf)
    return result


def placement_order(free: FloatArray, allocatable: FloatArray, request: FloatArray) -> IntArray:
    """Rows of the nodes one pod of `request` fits on, best first (the module's rules)."""
    key = placement_key(free, allocatable, request)
    order = np.argsort(key, kind="stable")  # stable: ties keep the row order
    result: IntArray = order[: int(np.count_nonzero(np.isfinite(key)))].astype(np.int64)
    return result


def best_node(free: FloatArray, allocatable: FloatArray, request: FloatArray) -> int | None:
    """The row one pod of `request` goes to, or None when it fits nowhere."""
    order = placement_order(free, allocatable, request)
    return int(order[0]) if order.size else None


def compact_down(
    counts: IntArray,
    rows: IntArray,
    row_count: int,
    keep: IntArray,
    node_rest: Callable[[BoolArray], FloatArray],
) -> IntArray:
    """Which pods stay when targets shrink, chosen so that scale-downs free whole nodes.

    Entries (rows[e], counts[e]) are one target's pods on one node, grouped by row in
    ascending order; `keep[row]` pods stay per target; `node_rest(mask)` says, for the
    entries in `mask`, how full each one's node stays once that target's pods there are gone
    (`entry_rest`; asked only for the targets that shrink). Each target empties its entries in
    order of that fullness (the emptiest node first, then the entry with fewer pods, then the
    lower position), all of an entry's pods before the next's. Worked example
    (test_compact_down_frees_the_emptiest_node): counts [2, 3] on nodes that stay 0.5 and
    0.0 full, keep 2: the second entry goes, [2, 0] stay.
    """
    stays: IntArray = counts.astype(np.int64)
    if counts.size == 0:
        return stays
    totals = np.bincount(rows, weights=counts, minlength=row_count).astype(np.int64)
    remove = totals - np.clip(keep, 0, totals)
    shrinking = remove[rows] > 0
    if not shrinking.any():
        return stays
    sub_rows, sub_counts = rows[shrinking], stays[shrinking]
    # lexsort: last key first; stable, so ties keep the entries' order
    order = np.lexsort((sub_counts, node_rest(shrinking), sub_rows))
    ordered_rows, ordered_counts = sub_rows[order], sub_counts[order]
    running = np.cumsum(ordered_counts) - ordered_counts  # pods before, over all rows
    first = np.r_[True, ordered_rows[1:] != ordered_rows[:-1]]
    before = running - running[first][np.cumsum(first) - 1]  # pods before, within the row
    removed = np.clip(remove[ordered_rows] - before, 0, ordered_counts)
    kept = np.empty_like(sub_counts)
    kept[order] = ordered_counts - removed
    stays[shrinking] = kept
    return stays


def removal_key(rest: FloatArray, allocatable: FloatArray, request: FloatArray) -> FloatArray:
    """Per node, the order in which a shrinking target leaves it (lower leaves first): the
    node's fullness once the target's pods are gone (`rest`), less 2 where pods of `request`
    (one row per node, or one for all) ask for no GPU and the node has GPUs: the mirror of
    `placement_key`'s rule 2, so GPUs are not stranded behind CPU pods that stay."""
    key = fullness(rest, allocatable)
    without_gpu = np.broadcast_to(request, rest.shape)[:, 2] <= 0
    result: FloatArray = key - 2.0 * (without_gpu & (allocatable[:, 2] > 0))
    return result


def entry_rest(
    used: FloatArray,
    allocatable: FloatArray,
    nodes: IntArray,
    counts: IntArray,
    requests: FloatArray,
) -> FloatArray:
    """`compact_down`'s node_rest: each entry's `removal_key`, how full its node stays
    without the entry's pods (`used`: requests per node now; `requests[e]`: one pod of entry
    e, or one row for every entry), GPU nodes first for pods without GPUs."""
    if nodes.size == 0:
        return np.zeros(0)
    rest = np.maximum(used[nodes] - counts[:, None] * requests, 0.0)
    return removal_key(rest, allocatable[nodes], requests)
