"""The packing model: placement as the packing scheduler profile places, scale-down victims that
free whole nodes, stranded capacity."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import numpy.typing as npt
from hypothesis import given, settings
from hypothesis import strategies as st

from tideshift.services.cluster.core.placement import (
    best_node,
    compact_down,
    entry_rest,
    fullness,
    placement_order,
)
from tideshift.services.planner.core import pack_sparse, stranded_capacity

GIB = 2.0**30
CPU_NODE = [8.0, 32 * GIB, 0.0]
GPU_NODE = [8.0, 32 * GIB, 4.0]


def rests(*values: float) -> Callable[[npt.NDArray[np.bool_]], npt.NDArray[np.float64]]:
    """compact_down's node_rest for fixed per-entry values."""
    array = np.array(values, dtype=np.float64)
    return lambda mask: array[mask]


def test_cpu_only_pod_stays_off_gpu_nodes_while_a_cpu_node_fits() -> None:
    allocatable = np.array([GPU_NODE, CPU_NODE])
    free = np.array([[8.0, 32 * GIB, 4.0], [2.0, 8 * GIB, 0.0]])
    assert best_node(free, allocatable, np.array([2.0, GIB, 0.0])) == 1
    # once the CPU node is full, the GPU node takes it
    assert best_node(free, allocatable, np.array([3.0, GIB, 0.0])) == 0
    assert best_node(free, allocatable, np.array([9.0, GIB, 0.0])) is None


def test_gpu_pod_goes_only_to_gpu_nodes() -> None:
    allocatable = np.array([CPU_NODE, GPU_NODE])
    free = allocatable.copy()
    assert placement_order(free, allocatable, np.array([1.0, GIB, 1.0])).tolist() == [1]


def test_the_most_allocated_node_wins() -> None:
    allocatable = np.array([CPU_NODE] * 3)
    free = np.array([[6.0, 30 * GIB, 0.0], [2.0, 8 * GIB, 0.0], [8.0, 32 * GIB, 0.0]])
    assert placement_order(free, allocatable, np.array([1.0, GIB, 0.0])).tolist() == [1, 0, 2]


def test_gpu_weighs_more_than_cpu_in_fullness() -> None:
    allocatable = np.array([GPU_NODE, GPU_NODE])
    used = np.array([[0.0, 0.0, 2.0], [4.0, 16 * GIB, 0.0]])
    score = fullness(used, allocatable)
    assert score[0] > score[1]  # half the GPUs in use beats half the cpu and memory


def test_pack_fills_the_fullest_node_before_touching_empty_ones() -> None:
    allocatable = np.array([CPU_NODE] * 3)
    free = np.array([[8.0, 32 * GIB, 0.0], [4.0, 16 * GIB, 0.0], [8.0, 32 * GIB, 0.0]])
    nodes, counts = pack_sparse(free, np.array([1.0, GIB, 0.0]), 6, allocatable)
    placed = dict(zip(nodes.tolist(), counts.tolist(), strict=True))
    assert placed == {1: 4, 0: 2}  # node 2 stays whole


def test_compact_down_frees_the_emptiest_node() -> None:
    stays = compact_down(np.array([2, 3]), np.array([0, 0]), 1, np.array([2]), rests(0.5, 0.0))
    assert stays.tolist() == [2, 0]


def test_compact_down_prefers_the_entry_that_is_cheaper_to_free() -> None:
    stays = compact_down(np.array([3, 1, 2]), np.array([0, 0, 0]), 1, np.array([4]), rests(0, 0, 0))
    assert stays.tolist() == [3, 0, 1]


def test_compact_down_frees_whole_nodes_from_a_spread_deployment() -> None:
    """Serving spread 2 per node over 4 nodes with 1 trainer on node 0 shrinks to 4: two whole
    nodes come free, not the trainer's."""
    allocatable = np.array([CPU_NODE] * 4)
    request = np.array([2.0, 4 * GIB, 0.0])
    nodes = np.arange(4)
    counts = np.array([2, 2, 2, 2])
    used = counts[:, None] * request
    used[0] += [2.0, 4 * GIB, 0.0]  # a trainer stays there
    rest = entry_rest(used, allocatable, nodes, counts, np.tile(request, (4, 1)))
    stays = compact_down(counts, np.zeros(4, dtype=np.int64), 1, np.array([4]), rests(*rest))
    assert stays.tolist()[0] == 2
    assert sorted(stays.tolist()) == [0, 0, 2, 2]


def test_cpu_pods_leave_gpu_nodes_before_cpu_nodes() -> None:
    """A CPU job with 3 trainers on a GPU node that stays full and 1 on a CPU node that would
    empty shrinks off the GPU node first: its GPUs, not an emptier CPU node, are what a GPU
    gang waits for."""
    allocatable = np.array([GPU_NODE, CPU_NODE])
    request = np.array([2.0, 4 * GIB, 0.0])
    counts = np.array([3, 1])
    used = counts[:, None] * request
    used[0] += [2.0, 4 * GIB, 0.0]  # another pod keeps the GPU node busier
    rest = entry_rest(used, allocatable, np.arange(2), counts, np.tile(request, (2, 1)))
    assert rest[0] < rest[1]
    stays = compact_down(counts, np.zeros(2, dtype=np.int64), 1, np.array([1]), rests(*rest))
    assert stays.tolist() == [0, 1]


def test_gpu_pods_leave_the_emptiest_gpu_node() -> None:
    """The GPU-node preference is for pods without GPUs only: GPU trainers leave by fullness."""
    allocatable = np.array([GPU_NODE, GPU_NODE])
    request = np.array([1.0, GIB, 1.0])
    counts = np.array([1, 3])
    used = counts[:, None] * request
    rest = entry_rest(used, allocatable, np.arange(2), counts, np.tile(request, (2, 1)))
    assert rest.tolist() == [0.0, 0.0]
    used[1] += [2.0, 4 * GIB, 1.0]  # node 1 stays busier
    rest = entry_rest(used, allocatable, np.arange(2), counts, np.tile(request, (2, 1)))
    assert rest[0] < rest[1]


@settings(max_examples=60, deadline=None)
@given(
    data=st.lists(st.tuples(st.integers(0, 3), st.integers(1, 6), st.floats(0, 1)), max_size=30),
    keep=st.lists(st.integers(-2, 40), min_size=4, max_size=4),
)
def test_compact_down_keeps_what_is_asked_and_never_adds(
    data: list[tuple[int, int, float]], keep: list[int]
) -> None:
    data.sort(key=lambda item: item[0])
    rows = np.array([row for row, _, _ in data], dtype=np.int64)
    counts = np.array([count for _, count, _ in data], dtype=np.int64)
    rest = np.array([value for _, _, value in data], dtype=np.float64)
    stays = compact_down(counts, rows, 4, np.array(keep, dtype=np.int64), rests(*rest))
    assert np.all(stays >= 0)
    assert np.all(stays <= counts)
    for row in range(4):
        total = int(counts[rows == row].sum())
        assert int(stays[rows == row].sum()) == min(max(keep[row], 0), total)
        # at most one entry of a target is cut part-way: the others stay whole or go whole
        mine = rows == row
        partial = (stays[mine] > 0) & (stays[mine] < counts[mine])
        assert int(partial.sum()) <= 1


def test_stranded_capacity_counts_free_room_where_no_pending_shape_fits() -> None:
    free = np.array([[3.0, 8 * GIB, 0.0], [1.0, 30 * GIB, 0.0], [0.5, GIB, 2.0]])
    shapes = np.array([[2.0, 4 * GIB, 0.0], [1.0, GIB, 1.0]])
    stranded = stranded_capacity(free, shapes)
    # node 0 fits the cpu shape; node 1 fits none; node 2's GPUs are stranded: its cores are
    # taken, so not even the GPU shape fits there
    assert stranded[0] == 1.5
    assert stranded[2] == 2.0
    assert stranded_capacity(free, np.zeros((0, 3))).tolist() == [0.0, 0.0, 0.0]
