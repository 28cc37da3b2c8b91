"""The planner's resync with the watcher's snapshot against a real nats-server: a workload
whose deletion never reached the planner (a flood made its subscription drop it) leaves its
plans once the snapshot has lacked it twice; one announced only in the snapshot joins them."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from datetime import UTC, datetime

import pytest
from prometheus_client import REGISTRY

from tests.integration.planner.test_planner_service import (
    Collector,
    collectors,
    eventually,
    node,
    settings_for,
)
from tideshift.events import (
    POD_CHANGED,
    WORKLOAD_CHANGED,
    PlanDecided,
    PlannerStatus,
    PodChanged,
    Resources,
    ServingPolicy,
    WorkloadChanged,
    WorkloadRef,
)
from tideshift.services.common.bus import Bus
from tideshift.services.planner import service
from tideshift.services.planner.service import Planner
from tideshift.services.planner.settings import PlannerSettings
from tideshift.services.watcher.core.snapshot import pod_key, workload_key

__all__ = ["collectors"]  # the fixture, shared with the planner's service tests

RESYNC_S = 0.5


def announced(ref: WorkloadRef) -> WorkloadChanged:
    return WorkloadChanged(
        change="added",
        workload=ref,
        role="serving",
        replicas=2,
        requests=Resources(cpu=0.5),
        serving=ServingPolicy(capacity_rps=50),
        observed_at=datetime.now(UTC),
    )


@contextlib.asynccontextmanager
async def resyncing(bus: Bus, settings: PlannerSettings, instance: str) -> AsyncIterator[Planner]:
    planner = Planner(bus, settings, instance, asyncio.Event(), resync_s=RESYNC_S)
    task = asyncio.create_task(planner.run())
    try:
        await asyncio.wait_for(planner.ready.wait(), 15)
        yield planner
    finally:
        planner.stopping.set()
        await asyncio.wait_for(task, 15)


def last_planned(plans: Collector, namespace: str) -> set[str] | None:
    """The names the latest plan for `namespace`'s workloads decided; None before one."""
    for plan in reversed(plans.items):
        if isinstance(plan, PlanDecided):
            names = {t.target.name for t in plan.targets if t.target.namespace == namespace}
            if names:
                return names
    return None


async def test_a_workload_whose_deletion_was_lost_leaves_the_plans_after_two_resyncs(
    bus: Bus, unique: str, collectors: dict[str, Collector]
) -> None:
    settings = settings_for(unique, serving=[], training=[])
    web, api = (
        WorkloadRef(namespace=unique, kind="Deployment", name=name) for name in ("web", "api")
    )
    kv = await bus.kv(settings.snapshot_bucket)
    await kv.put(f"node.n-{unique}", node(f"n-{unique}", 16.0))
    await kv.put(workload_key(web), announced(web))
    async with resyncing(bus, settings, f"a-{unique}") as planner:
        # `api` is announced on the bus and written to the snapshot, as the watcher does.
        await bus.publish(
            WORKLOAD_CHANGED.at(namespace=unique, kind=api.kind, name=api.name), announced(api)
        )
        await kv.put(workload_key(api), announced(api))
        plans = collectors["plans"]
        await eventually(lambda: last_planned(plans, unique) == {"web", "api"})

        # `web` is deleted; its deletion event is lost, only the snapshot says it.
        await kv.delete(workload_key(web))
        await eventually(lambda: web not in planner.state.book.announced, timeout=20)
        assert planner.state.known.get(web) is None
        plans_after = len(plans.items)
        await eventually(
            lambda: len(plans.items) > plans_after and last_planned(plans, unique) == {"api"}
        )
        assert api in planner.state.book.announced


async def test_a_workload_only_the_snapshot_announces_joins_the_plans(
    bus: Bus, unique: str, collectors: dict[str, Collector]
) -> None:
    settings = settings_for(unique, serving=[], training=[])
    web = WorkloadRef(namespace=unique, kind="Deployment", name="web")
    kv = await bus.kv(settings.snapshot_bucket)
    await kv.put(f"node.n-{unique}", node(f"n-{unique}", 16.0))
    async with resyncing(bus, settings, f"a-{unique}"):
        plans = collectors["plans"]
        # Its announcement on the bus was lost: the next resync reads it from the snapshot.
        await kv.put(workload_key(web), announced(web))
        await eventually(lambda: last_planned(plans, unique) == {"web"}, timeout=20)


async def test_a_planner_announces_its_status_again_without_a_change(
    bus: Bus, unique: str, collectors: dict[str, Collector], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A reader that missed the change (the decision history did not exist yet) still learns
    the planner's mode: the status is announced again after a while."""
    monkeypatch.setattr(service, "REANNOUNCE_S", 0.5)
    settings = settings_for(unique, serving=[], training=[])
    instance = f"p-{unique}"

    def announcements() -> list[PlannerStatus]:
        items = collectors["status"].items
        return [s for s in items if isinstance(s, PlannerStatus) and s.planner == instance]

    async with resyncing(bus, settings, instance):
        await eventually(lambda: len(announcements()) >= 3)
    modes = [status.mode for status in announcements()]
    assert modes[-1] == modes[-2], "the same mode, announced again"


def pod(namespace: str, name: str) -> PodChanged:
    return PodChanged(
        change="added",
        namespace=namespace,
        name=name,
        phase="Running",
        node=f"n-{namespace}",
        requests=Resources(cpu=0.5),
        observed_at=datetime.now(UTC),
    )


def repaired_pods() -> float:
    return (
        REGISTRY.get_sample_value("tideshift_planner_resync_repaired_total", {"kind": "pod"}) or 0.0
    )


async def test_pods_whose_events_were_lost_are_repaired_from_the_snapshot(
    bus: Bus, unique: str
) -> None:
    settings = settings_for(unique, serving=[], training=[])
    kv = await bus.kv(settings.snapshot_bucket)
    await kv.put(f"node.n-{unique}", node(f"n-{unique}", 16.0))
    before = repaired_pods()
    async with resyncing(bus, settings, f"r-{unique}") as planner:
        # Seen live, but its deletion was lost: the snapshot (the watcher's truth) lacks it.
        await bus.publish(POD_CHANGED.at(namespace=unique, name="gone"), pod(unique, "gone"))
        await eventually(lambda: (unique, "gone") in planner.state.pod_seen)
        # Its addition was lost: only the snapshot has it.
        await kv.put(pod_key(unique, "kept"), pod(unique, "kept"))
        await eventually(
            lambda: (
                (unique, "gone") in planner.state.deleted_pods
                and (unique, "kept") in planner.state.pod_seen
                and len(planner.state.table) == 1
            )
        )
        assert repaired_pods() - before >= 2


async def test_events_lost_by_a_subscription_bring_the_resync_forward(
    bus: Bus, unique: str
) -> None:
    """A subscription that dropped events sets `events_lost` (the bus's on_drop): the snapshot
    is read at once, not at the next period (an hour here)."""
    settings = settings_for(unique, serving=[], training=[])
    kv = await bus.kv(settings.snapshot_bucket)
    await kv.put(f"node.n-{unique}", node(f"n-{unique}", 16.0))
    planner = Planner(bus, settings, f"l-{unique}", asyncio.Event(), resync_s=3600.0)
    task = asyncio.create_task(planner.run())
    try:
        await asyncio.wait_for(planner.ready.wait(), 15)
        await kv.put(pod_key(unique, "missed"), pod(unique, "missed"))
        planner.events_lost.set()
        await eventually(lambda: (unique, "missed") in planner.state.pod_seen)
        assert not planner.events_lost.is_set()  # consumed by that read
    finally:
        planner.stopping.set()
        await asyncio.wait_for(task, 15)
