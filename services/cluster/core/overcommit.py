"""Overcommit: what serving reserves but does not use, lent to batch trainers. Per node, what
is lent (`lendable`) is the idle part of what non-batch pods request, within reclaimable =
allocatable - what non-batch pods use - a safety margin; both shrink as serving's usage rises.
The planner, the executor's advertisement, `simulate` and the demo all lend by this one
definition. Pure numpy; no I/O, no clock."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from tideshift.services.cluster.core.placement import FloatArray

# Extended resources the executor advertises on each Node's status; opted-in trainers request
# these instead of cpu / memory.
BATCH_CPU = "tideshift.io/batch-cpu"
BATCH_MEMORY = "tideshift.io/batch-memory"


@dataclass(frozen=True, slots=True)
class OvercommitConfig:
    margin: float = 0.1  # fraction of each node's allocatable never lent

    def __post_init__(self) -> None:
        if not 0.0 <= self.margin < 1.0:
            raise ValueError(f"margin: expected a fraction in [0, 1), got {self.margin!r}")


def reclaimable(
    allocatable: FloatArray, non_batch_used: FloatArray, config: OvercommitConfig
) -> FloatArray:
    """Per node (cpu, memory) batch trainers may use: allocatable - what serving and every
    other non-batch pod uses (measured, not requested) - the margin; never negative.

    `allocatable` and `non_batch_used` are (nodes, 3) or (nodes, 2); only cpu and memory are
    lent (GPUs are not shared)."""
    alloc = allocatable[:, :2]
    lendable: FloatArray = np.maximum(alloc * (1.0 - config.margin) - non_batch_used[:, :2], 0.0)
    return lendable


def idle_reservation(requested: FloatArray, used: FloatArray) -> FloatArray:
    """Per node what non-batch pods request but do not use (never negative)."""
    idle: FloatArray = np.maximum(requested - used, 0.0)
    return idle


def lendable(
    allocatable: FloatArray,
    non_batch_used: FloatArray,
    idle: FloatArray,
    config: OvercommitConfig,
) -> FloatArray:
    """Per node (cpu, memory) batch trainers may use: `idle` (what non-batch pods reserve and
    do not use, `idle_reservation`) within `reclaimable`. Room no request holds is not lent: a
    pod on requests (a serving scale-up, a new job) may bind there at any moment, and a batch
    trainer there would leave a rise in serving's usage only the margin to absorb."""
    room: FloatArray = np.minimum(
        np.maximum(idle[:, :2], 0.0), reclaimable(allocatable, non_batch_used, config)
    )
    return room
