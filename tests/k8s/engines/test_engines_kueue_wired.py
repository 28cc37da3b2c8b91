"""Quota lent to Kueue by a running Tideshift, with the real Kueue: the real planner plans
serving from a stand-in predictor's forecasts and publishes serving's need beside each plan;
the real executor service (`kueue_lending` on) lends a labelled ClusterQueue what serving will
not need, and the queue's nominalQuota follows the forecast down and up again. A second
labelled queue naming no flavor of its own gets its reason in the executor's published
result (`kueue.quota`) and a Warning Event, and the good queue goes on."""

from __future__ import annotations

import asyncio
import contextlib
import functools
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from tests.k8s.engines.engine_objects import CLUSTERQUEUES, kueue_queues, merge_patch
from tideshift.events import (
    FORECAST,
    NODE_CHANGED,
    ForecastIssued,
    ForecastPoint,
    NodeChanged,
    Resources,
    WorkloadRef,
)
from tideshift.events.models import KueueQuotaLent, ServingNeed
from tideshift.events.subjects import KUEUE_QUOTA, SERVING_NEED
from tideshift.services.cluster.adapters.http import KubeHttp
from tideshift.services.cluster.core.conversions import parse_quantity
from tideshift.services.cluster.core.kueue_quota import LEND_QUOTA_LABEL
from tideshift.services.common.bus import Bus
from tideshift.services.common.runtime import ServiceContext
from tideshift.services.devcluster.cluster import LocalCluster
from tideshift.services.executor import service as executor_service
from tideshift.services.executor.kueue_lending import QUOTA_REASON
from tideshift.services.executor.settings import ExecutorSettings
from tideshift.services.planner.service import Planner
from tideshift.services.planner.settings import PlannerSettings, ServingTarget

pytestmark = pytest.mark.k8s

GIB = 2.0**30
FOLLOW_S = 30.0


def serving(ns: str) -> ServingTarget:
    """1 cpu a replica at 100 req/s; scale-down after 1 s of stabilisation (the test's day)."""
    return ServingTarget(
        namespace=ns,
        name="web",
        cpu=1.0,
        memory=GIB,
        capacity_rps=100.0,
        min_replicas=1,
        max_replicas=20,
        lead_time_s=30.0,
        margin_s=30.0,
        stabilization_s=1.0,
        quantile=0.95,
    )


def forecast(ns: str, rps: float) -> ForecastIssued:
    issued = datetime.now(UTC)
    return ForecastIssued(
        workload=WorkloadRef(kind="Deployment", namespace=ns, name="web"),
        issued_at=issued,
        step_seconds=60,
        model="stand-in",
        points=tuple(
            ForecastPoint(
                at=issued + timedelta(seconds=60 * k), point=rps, q50=rps, q90=rps, q95=rps, q99=rps
            )
            for k in range(10)
        ),
    )


def real_nodes(http: KubeHttp) -> list[NodeChanged]:
    """The control plane's nodes as the watcher announces them (its stand-in here)."""
    found = []
    for item in http.get("/api/v1/nodes")["items"]:
        if item.get("spec", {}).get("unschedulable"):
            continue
        allocatable = item["status"]["allocatable"]
        found.append(
            NodeChanged(
                change="added",
                name=item["metadata"]["name"],
                allocatable=Resources(
                    cpu=float(parse_quantity(allocatable["cpu"])),
                    memory=float(parse_quantity(allocatable["memory"])),
                ),
                ready=True,
                observed_at=datetime.now(UTC),
            )
        )
    return found


def nominal_cpu(http: KubeHttp, queue: str) -> float:
    flavor = http.get(f"{CLUSTERQUEUES}/{queue}")["spec"]["resourceGroups"][0]["flavors"][0]
    return float(
        parse_quantity(next(r for r in flavor["resources"] if r["name"] == "cpu")["nominalQuota"])
    )


@contextlib.asynccontextmanager
async def gathered(bus: Bus, subject: Any, consumer: str) -> AsyncIterator[list[Any]]:
    items: list[Any] = []

    async def run() -> None:
        async for envelope in bus.subscribe(subject, consumer=consumer):
            items.append(envelope.data)

    task = asyncio.create_task(run())
    await asyncio.sleep(0.05)
    await bus.flush()
    try:
        yield items
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def until(check: Any, what: str) -> None:
    deadline = asyncio.get_running_loop().time() + FOLLOW_S
    while not check():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"not within {FOLLOW_S:.0f}s: {what}")
        await asyncio.sleep(0.1)


async def test_a_running_tideshift_lends_kueue_what_serving_will_not_need(
    engines_cluster: LocalCluster,
    engine_admin: KubeHttp,
    engine_namespace: str,
    bus: Bus,
    unique: str,
) -> None:
    http, ns = engine_admin, engine_namespace
    good, _ = kueue_queues(http, ns, name=f"lent-{ns}"[:60], cpu="0")
    bad, _ = kueue_queues(http, ns, name=f"badflavor-{ns}"[:60], cpu="0")
    merge_patch(
        http,
        f"{CLUSTERQUEUES}/{good}",
        {"metadata": {"labels": {LEND_QUOTA_LABEL: f"{good}-flavor"}}},
    )
    merge_patch(
        http,
        f"{CLUSTERQUEUES}/{bad}",
        {"metadata": {"labels": {LEND_QUOTA_LABEL: "no-such-flavor"}}},
    )
    planner_settings = PlannerSettings(
        serving=[serving(ns)],
        tick_seconds=0.3,
        debounce_seconds=0.05,
        lease_name=f"planner-{unique}",
        lease_ttl_seconds=1.0,
        snapshot_bucket=f"snapshot_{unique}",
        health_port=-1,
        rise_history_bucket="",
    )
    executor_settings = ExecutorSettings(
        kubeconfig=str(engines_cluster.kubeconfig_path),
        kueue_lending=True,
        kueue_quota_min_interval_seconds=0.0,
        durable=f"ex-{unique}",
        record_bucket=f"records_{unique}",
        allowed_namespaces=[ns],  # no Deployment web: its commands are refused, not applied
        health_port=-1,
    )
    context = ServiceContext("executor", executor_settings, bus, f"k-{unique}")
    executor = asyncio.create_task(executor_service.serve(executor_settings, context))
    planner = Planner(bus, planner_settings, f"p-{unique}", asyncio.Event())
    planning = asyncio.create_task(planner.run())
    try:
        async with (
            gathered(bus, KUEUE_QUOTA.filter(), f"q-{unique}") as lent,
            gathered(bus, SERVING_NEED.filter(), f"n-{unique}") as needs,
        ):
            await asyncio.wait_for(context.ready.wait(), 60)
            for node in real_nodes(http):
                await bus.publish(NODE_CHANGED.at(name=node.name), node)
            predict = functools.partial(bus.publish, FORECAST.at(namespace=ns, workload="web"))

            def lent_for(reserved: float) -> tuple[ServingNeed, KueueQuotaLent] | None:
                """The latest lending step of a plan that reserved `reserved` cpu."""
                by_id = {n.plan_id: n for n in needs if n.reserved.cpu == reserved}
                done = [x for x in lent if x.plan_id in by_id]
                return (by_id[done[-1].plan_id], done[-1]) if done else None

            seen = []
            for rps, reserved in ((300.0, 3.0), (1200.0, 12.0), (500.0, 5.0)):
                await predict(forecast(ns, rps))
                await until(
                    lambda r=reserved: lent_for(r) is not None,
                    f"a quota lent for serving reserving {reserved} cpu",
                )
                found = lent_for(reserved)
                assert found is not None
                need, step = found
                steps = {q.queue: q for q in step.queues}
                # Serving's need as planned: web sized to the forecast (1 cpu a replica).
                assert need.expected.cpu == reserved and need.other.cpu == 0.0, need
                # Bad input reaches the executor's result with its reason; the good queue goes on.
                assert steps[bad].error and "names no flavor" in steps[bad].reason, steps[bad]
                assert not steps[good].error, steps[good]
                # capacity - serving's reservation, shared by the labelled queues (other
                # tests may have left theirs labelled).
                sharing = sum(1 for q in step.queues if not q.error)
                expected = (need.capacity.cpu - reserved) / sharing
                assert steps[good].cpu == pytest.approx(expected, abs=0.01), step
                await until(
                    lambda e=expected: abs(nominal_cpu(http, good) - e) < 0.01,
                    f"nominalQuota of {good} at {expected:.2f} cpu",
                )
                seen.append(nominal_cpu(http, good))
            # Down for serving's peak, back up after it.
            assert seen[1] < seen[0] and seen[2] > seen[1], seen
            warnings = http.get(
                "/api/v1/namespaces/default/events",
                query=[("fieldSelector", f"involvedObject.name={bad}")],
            )["items"]
            assert any(e["reason"] == QUOTA_REASON for e in warnings), warnings
    finally:
        context.stopping.set()
        planner.stopping.set()
        await asyncio.wait_for(asyncio.gather(executor, planning, return_exceptions=True), 30)
        for queue in (good, bad):  # not lent to by the tests after this one
            merge_patch(
                http, f"{CLUSTERQUEUES}/{queue}", {"metadata": {"labels": {LEND_QUOTA_LABEL: None}}}
            )
