"""Targets a plan skips get Warning Events, through a real nats-server: the watcher's side
follows plan.decided and writes through its EventRecorder (the simulated cluster's here)."""

from __future__ import annotations

import asyncio
import contextlib
from datetime import UTC, datetime

from tideshift.events import PLAN_DECIDED, PlanDecided, TargetDecision, WorkloadRef
from tideshift.services.cluster.sim import SimCluster, SimClusterPort
from tideshift.services.common.bus import Bus
from tideshift.services.watcher.skipped import SKIPPED_REASON, follow_skipped

WAIT = 10.0


async def test_skipped_targets_of_a_published_plan_are_warned(bus: Bus) -> None:
    port = SimClusterPort(SimCluster([]))
    stopping = asyncio.Event()
    target = WorkloadRef("shop", "Deployment.apps", "w" * 253)  # the longest legal name
    plan = PlanDecided(
        plan_id="p1",
        policy="tideshift",
        decided_at=datetime.now(UTC),
        targets=(
            TargetDecision(
                target=target,
                current=2,
                desired=2,
                reason="skipped: cannot be planned (OverflowError: x)",
                skipped=True,
            ),
            TargetDecision(
                target=WorkloadRef("shop", "Deployment.apps", "fine"),
                current=1,
                desired=3,
                reason="planned",
            ),
        ),
    )
    following = asyncio.create_task(follow_skipped(port, bus, stopping))
    try:
        deadline = asyncio.get_running_loop().time() + WAIT
        # Published until seen: the subscription registers asynchronously.
        while not port.events:
            assert asyncio.get_running_loop().time() < deadline, "no Warning Event recorded"
            await bus.publish(PLAN_DECIDED.at(policy="tideshift"), plan)
            await asyncio.sleep(0.1)
    finally:
        stopping.set()
        following.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await following
    assert {event[:2] for event in port.events} == {(target, SKIPPED_REASON)}
