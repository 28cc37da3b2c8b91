"""The planner's reads of the watcher's KV snapshot: once at start (the bootstrap), then every
RESYNC_S to heal what the live subscriptions lost (`PlannerState.resync_workloads` and
`resync_cluster`)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial

from prometheus_client import Counter

from tideshift.events import NodeChanged, PodChanged, WorkloadChanged
from tideshift.services.common.bus.port import BusPort
from tideshift.services.common.clock import Clock, wait_for_event
from tideshift.services.common.memory import compact_tables, release_freed_memory
from tideshift.services.planner import core as pol
from tideshift.services.planner.core.state import PlannerState

log = logging.getLogger("tideshift.planner")

SKIPPED = Counter(
    "tideshift_planner_snapshot_skipped_total", "Snapshot entries skipped: unreadable or odd"
)
REPAIRED = Counter(
    "tideshift_planner_resync_repaired_total",
    "Nodes and pods the live events had left wrong (lost events) that a resync repaired",
    ["kind"],
)
# Like the predictor's resync: a workload whose deletion was lost is dropped within two
# periods, and a read of the whole snapshot (155,700 keys: seconds) stays rare.
RESYNC_S = 120.0
# A failed read (a busy server) is tried again this soon, not a period later; so is one that
# found holes in the view, to confirm the deletions only a second read may make.
RETRY_S = 10.0
# Entries parsed between yields to the event loop: a whole read (155,700 entries, seconds of
# parsing) must not stall the live subscriptions, whose buffers would overflow meanwhile.
PARSE_BATCH = 1000


@dataclass
class Snapshot:
    """What the snapshot holds, by kind."""

    nodes: list[NodeChanged] = field(default_factory=list)
    pods: list[PodChanged] = field(default_factory=list)
    workloads: dict[pol.Target, WorkloadChanged] = field(default_factory=dict)


async def read(bus: BusPort, bucket: str) -> Snapshot | None:
    """The whole snapshot in one pass; None when it cannot be read (none yet, a busy server).
    An unreadable entry is counted, logged and skipped."""
    try:
        kv = await bus.kv(bucket)
        values = await kv.values()  # one pass, not a request per key
    except Exception as error:
        log.warning("no cluster snapshot in %s: %s", bucket, error)
        return None
    held = Snapshot()
    for index, (key, value) in enumerate(values.items()):
        if index % PARSE_BATCH == PARSE_BATCH - 1:
            await asyncio.sleep(0)
        try:
            if key.startswith("node."):
                held.nodes.append(NodeChanged.model_validate_json(value))
            elif key.startswith("pod."):
                held.pods.append(PodChanged.model_validate_json(value))
            elif key.startswith("workload."):
                workload = WorkloadChanged.model_validate_json(value)
                held.workloads[workload.workload] = workload
        except ValueError as error:  # the watcher wrote it: skip, say so, go on
            SKIPPED.inc()
            log.warning("skipped snapshot key %s: %s", key, error)
    return held


def bootstrap(state: PlannerState, held: Snapshot, now: float) -> int:
    """Fold the snapshot into the state (for each object the newer observation wins, so live
    events that arrived meanwhile stay); how many objects it applied. One that raises is
    counted, logged and skipped: it must not keep the planner from starting."""
    steps: list[Callable[[], bool]] = [
        *(partial(state.apply_node, node, now) for node in held.nodes),
        *(partial(state.apply_workload, w, now) for w in held.workloads.values()),
        *(partial(state.apply_pod, pod, now) for pod in held.pods),
    ]
    loaded = 0
    for step in steps:
        try:
            step()
        except Exception as error:
            SKIPPED.inc()
            log.warning("skipped a snapshot entry: %s", error)
        else:
            loaded += 1
    return loaded


async def resync(
    bus: BusPort,
    bucket: str,
    state: PlannerState,
    *,
    clock: Clock,
    stopping: asyncio.Event,
    changed: Callable[[], None],
    interval: float = RESYNC_S,
    lost: asyncio.Event | None = None,
) -> None:
    """Every `interval` until stopping, the announced workloads, nodes and pods become the
    snapshot's; calls `changed` when that calls for a plan. `lost` (set when a subscription
    dropped events) brings the next read forward to now."""
    wait = interval
    sooner = (lost,) if lost is not None else ()
    while not await wait_for_event(clock, stopping, wait, *sooner):
        if lost is not None:
            lost.clear()
        read_at = clock.now()
        held = await read(bus, bucket)
        wait = interval if held is not None else min(interval, RETRY_S)
        if held is None:
            continue
        try:
            workloads = state.resync_workloads(held.workloads, clock.now())
            # No node or pod at all: no watcher wrote it, the live view is all there is.
            repaired = (
                state.resync_cluster(held.nodes, held.pods, read_at, clock.now())
                if held.nodes or held.pods
                else {}
            )
        except Exception:  # logged; the next period tries again
            SKIPPED.inc()
            log.exception("resync with %s failed", bucket)
            continue
        for kind, count in repaired.items():
            REPAIRED.labels(kind).inc(count)
        if any(repaired.values()):
            log.warning("resync repaired %s: live events were lost", repaired)
            wait = min(interval, RETRY_S)
        if workloads or any(repaired.values()):
            changed()
        # A flood of names, applied by now and gone, leaves the state's tables sized for it
        # and its memory in glibc's arenas.
        for owner in (state, state.book, state.table):
            compact_tables(owner)
        await asyncio.to_thread(release_freed_memory)
