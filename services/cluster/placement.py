"""Where a pod goes: the one packing model that the simulated scheduler binds with, that the
planner's feasibility check assumes, and that the `tideshift-packing` kube-scheduler profile
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
