"""The watcher beside other autoscalers, on real NATS through a port of our own: a workload
an HPA targets is announced held (the reason names the HPA), its owner gets one Warning Event
and the count goes up; one in steer mode stays free; the HPA gone, the workload is announced
free again; a listing that fails is counted and the next one works."""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import replace
from typing import Any

from prometheus_client import REGISTRY

from tests.integration.cluster.test_watcher_executor_bus import eventually
from tests.integration.cluster.test_watcher_workloads import WorkloadPort
from tideshift.events import WORKLOAD_CHANGED, WorkloadChanged, WorkloadRef
from tideshift.services.cluster.adapters.autoscalers import Listing
from tideshift.services.cluster.core.autoscalers import HPA_KIND, LEFT_TO, Autoscaler
from tideshift.services.cluster.port import ClusterChange, Resources, Workload
from tideshift.services.common.bus import Bus
from tideshift.services.watcher.autoscalers import follow_autoscalers
from tideshift.services.watcher.watcher import HELD_BY_ENGINE_REASON, Watcher


def serving(namespace: str, name: str, **annotations: str) -> Workload:
    return Workload(
        ref=WorkloadRef(namespace, "Deployment.apps", name),
        role="serving",
        replicas=3,
        ready_replicas=3,
        min_replicas=0,
        max_replicas=None,
        requests=Resources(cpu=0.5),
        annotations=tuple(sorted({"tideshift.io/capacity-rps": "10", **annotations}.items())),
    )


def hpa_on(workload: Workload) -> Autoscaler:
    ref = workload.ref
    return Autoscaler(HPA_KIND, ref.namespace, f"{ref.name}-hpa", ref, 1, 10)


def counted() -> float:
    return (
        REGISTRY.get_sample_value("tideshift_watcher_other_autoscalers_total", {"kind": HPA_KIND})
        or 0.0
    )


class FlakyLister:
    """Fails its first listing, then lists what it holds."""

    def __init__(self, autoscalers: list[Autoscaler]) -> None:
        self.autoscalers, self.calls = autoscalers, 0

    async def list_autoscalers(self) -> Listing:
        self.calls += 1
        if self.calls == 1:
            raise ConnectionError("apiserver unreachable")
        return Listing(list(self.autoscalers))


async def test_an_hpa_holds_its_workload_until_it_is_gone(bus: Bus, unique: str) -> None:
    web = serving(unique, "web")
    api = serving(unique, "api", **{"tideshift.io/other-autoscaler": "steer"})
    port = WorkloadPort([web, api])
    announced: list[WorkloadChanged] = []

    async def follow() -> None:
        subject = WORKLOAD_CHANGED.filter(namespace=unique)
        async for envelope in bus.subscribe(subject, consumer=f"t-{unique}"):
            announced.append(envelope.data)

    def latest(name: str) -> WorkloadChanged | None:
        found = [e for e in announced if e.workload.name == name]
        return found[-1] if found else None

    follower = asyncio.create_task(follow())
    await asyncio.sleep(0)
    await bus.flush()
    watcher = Watcher(port, bus, bucket=f"snap_{unique}")  # type: ignore[arg-type]
    task = asyncio.create_task(watcher.run())
    stopping = asyncio.Event()
    lister = FlakyLister([hpa_on(web), hpa_on(api)])
    failures = REGISTRY.get_sample_value("tideshift_watcher_autoscaler_listing_failures_total")
    before = counted()
    listing: asyncio.Task[Any] | None = None
    try:
        await eventually(lambda: len(announced) == 2, "the first reconcile")
        assert all(e.held_by == "" for e in announced)
        listing = asyncio.create_task(follow_autoscalers(lister, watcher, stopping, period_s=0.05))
        await eventually(lambda: (latest("web") or announced[0]).held_by, "web held")
        held = latest("web")
        assert held is not None and held.held_by.startswith(LEFT_TO)
        assert f"HorizontalPodAutoscaler {unique}/web-hpa" in held.held_by
        assert (
            REGISTRY.get_sample_value("tideshift_watcher_autoscaler_listing_failures_total")
            == (failures or 0.0) + 1
        )
        # Steered: never held, never announced again.
        assert [e.held_by for e in announced if e.workload.name == "api"] == [""]
        # One Warning Event for the hold however many listings repeat it; counted once.
        await eventually(lambda: lister.calls > 5, "more listings")
        told = [e for e in port.events if e[1] == HELD_BY_ENGINE_REASON]
        assert len(told) == 1 and told[0][0] == web.ref and "web-hpa" in told[0][2]
        assert counted() == before + 1

        # A later change of the workload (its status) keeps the hold.
        seen = len(announced)
        await port.changes.put(ClusterChange("modified", replace(web, ready_replicas=2)))
        await eventually(lambda: len(announced) > seen, "the change")
        changed = latest("web")
        assert changed is not None and changed.ready_replicas == 2
        assert changed.held_by == held.held_by
        # The HPA deleted: free again.
        lister.autoscalers = [hpa_on(api)]
        await eventually(lambda: (latest("web") or held).held_by == "", "web free again")
        assert watcher.autoscalers_of(web.ref) == ()
    finally:
        stopping.set()
        for pending in (task, follower, listing):
            if pending is None:
                continue
            pending.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await pending
