"""Warning Events for the targets a plan marks `skipped` (the planner could not size them and
they keep their last decision): the owner sees why with `kubectl describe`, next to the
object. The same target is skipped in every plan until its settings change; the port's
event writer aggregates repeats into one Event's count.

The watcher does this because it already holds the permission to write Events; the planner
talks to no cluster.
"""

from __future__ import annotations

import asyncio
import logging

from prometheus_client import Counter

from tideshift.events import PLAN_DECIDED, PlanDecided
from tideshift.services.common.bus.port import BusPort
from tideshift.services.watcher.watcher import EventRecorder

log = logging.getLogger("tideshift.watcher")

SKIPPED_REASON = "TideshiftSkipped"
SKIPPED_EVENTS = Counter(
    "tideshift_watcher_skipped_events_total",
    "Warning Events for targets a plan skipped, by whether they were written",
    ["written"],
)


async def warn_skipped(recorder: EventRecorder, plan: PlanDecided) -> int:
    """One Warning Event per skipped target of the plan; how many were written."""
    written = 0
    for item in plan.targets:
        if not item.skipped:
            continue
        try:
            await recorder.record_event(item.target, reason=SKIPPED_REASON, message=item.reason)
        except Exception as error:  # one object's Event never stops the others
            SKIPPED_EVENTS.labels("false").inc()
            log.warning("cannot record a skipped event on %s: %s", item.target, error)
            continue
        SKIPPED_EVENTS.labels("true").inc()
        written += 1
    return written


async def follow_skipped(recorder: EventRecorder, bus: BusPort, stopping: asyncio.Event) -> None:
    """Warn about skipped targets of every plan until `stopping` is set. A subscription that
    fails (e.g. the bus denies this role plan.decided) is logged: the watcher's own work,
    the cluster's changes, goes on without these warnings."""
    plans = bus.subscribe(PLAN_DECIDED.filter(), consumer="watcher-skipped")
    try:
        async for envelope in plans:
            if stopping.is_set():
                return
            await warn_skipped(recorder, envelope.data)
    except Exception as error:
        log.error("no Warning Events for skipped targets: plan.decided not followed: %s", error)
    finally:
        await plans.aclose()  # type: ignore[attr-defined]
