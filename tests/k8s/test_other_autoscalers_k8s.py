"""No fight with other autoscalers, on the real control plane with the real HPA controller
(kube-controller-manager's `horizontalpodautoscaling`, synced every 5 s in the development
cluster) and a real nats-server. The watcher and the executor run in process as their
ServiceAccounts, bound to exactly the chart's ClusterRoles (charts/tideshift/files/rbac.yaml),
so these tests also prove those roles suffice.

* default: a Deployment an HPA targets is held (the watcher's announcement says why, the plan
  holds it with that reason, `tideshift status` shows it, a Warning Event is on it), and the
  executor writes nothing to it while the HPA controller keeps its replicas; once the HPA is
  deleted the workload is announced free again and the executor writes it;
* steer (`tideshift.io/other-autoscaler: steer`): the executor raises the HPA's minReplicas
  to the plan's count, and the HPA controller itself moves replicas up to it: it enforces
  minReplicas before it reads any metric (pkg/controller/podautoscaler/horizontal.go,
  reconcileAutoscaler: "Current number of replicas below Spec.MinReplicas"), so no metrics
  server is needed and the controller stays the real one;
* a KEDA ScaledObject (structural CRD; KEDA is not built) is honoured the same way, and one
  that cannot be read is skipped and counted, never a crash.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import subprocess
from collections.abc import AsyncIterator, Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from kubernetes.client.exceptions import ApiException

from tests.k8s import test_workloads_e2e as e2e
from tests.k8s.cluster_objects import (
    collection,
    create,
    deployment,
    service_kubeconfig,
    wait_until,
)
from tests.k8s.test_workloads_e2e import Loop, tideshift
from tideshift.events import (
    PLAN_DECIDED,
    WORKLOAD_CHANGED,
    ScaleCommand,
    WorkloadChanged,
    WorkloadRef,
)
from tideshift.services.cluster.adapters.autoscalers import SKIPPED
from tideshift.services.cluster.adapters.http import KubeHttp
from tideshift.services.cluster.core.autoscalers import LEFT_TO, MODE_ANNOTATION
from tideshift.services.cluster.informer import WatchTuning
from tideshift.services.cluster.kubernetes import KubernetesClusterPort
from tideshift.services.common.bus import Bus
from tideshift.services.devcluster.crds import KEDA_SCALED_OBJECT_CRD
from tideshift.services.executor.executor import (
    LEFT_TO_AUTOSCALER_REASON,
    STEERED_REASON,
    Executor,
    RecordStore,
)
from tideshift.services.insight.core import picture
from tideshift.services.planner import core as pol
from tideshift.services.planner.core.targets import TargetBook
from tideshift.services.planner.outputs import plan_decided
from tideshift.services.watcher.autoscalers import follow_autoscalers
from tideshift.services.watcher.watcher import Watcher

pytestmark = pytest.mark.k8s
WAIT = 60.0
# The HPA controller syncs every 5 s here (the dev cluster's controller-manager flag; 15 s by
# default); on a loaded two-core machine give it many rounds.
HPA_FOLLOW_S = 120.0
T0 = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)
LISTING_PERIOD_ENV = "TIDESHIFT_AUTOSCALERS_PERIOD_SECONDS"  # the watcher's setting
HPAS = "/apis/autoscaling/v2/namespaces/{ns}/horizontalpodautoscalers"
SCALED_OBJECTS = "/apis/keda.sh/v1alpha1/namespaces/{ns}/scaledobjects"


def hpa(name: str, target: str, *, low: int, high: int) -> dict[str, Any]:
    return {
        "apiVersion": "autoscaling/v2",
        "kind": "HorizontalPodAutoscaler",
        "metadata": {"name": name},
        "spec": {
            "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": target},
            "minReplicas": low,
            "maxReplicas": high,
            "metrics": [
                {
                    "type": "Resource",
                    "resource": {
                        "name": "cpu",
                        "target": {"type": "Utilization", "averageUtilization": 50},
                    },
                }
            ],
        },
    }


def scaled_object(name: str, target: str, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "keda.sh/v1alpha1",
        "kind": "ScaledObject",
        "metadata": {"name": name},
        "spec": {"scaleTargetRef": {"name": target}, "triggers": [{"type": "cpu"}], **spec},
    }


def serving(name: str, replicas: int, annotations: dict[str, str]) -> dict[str, Any]:
    """A Deployment that joined Tideshift as a serving workload (its own role label)."""
    body = deployment(
        name, replicas, annotations={"tideshift.io/capacity-rps": "10", **annotations}
    )
    body["metadata"]["labels"] = {"tideshift.io/role": "serving"}
    return body


def install_keda_crd(admin: KubeHttp, namespace: str) -> None:
    crds = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"
    create(admin, crds, KEDA_SCALED_OBJECT_CRD)

    def served() -> bool:
        try:
            admin.get(SCALED_OBJECTS.format(ns=namespace))
        except ApiException:
            return False
        return True

    wait_until(served, what="the ScaledObject CRD to be served")


def port_as(kubeconfig: Path, namespace: str) -> KubernetesClusterPort:
    port = KubernetesClusterPort.from_kubeconfig(
        kubeconfig, namespace=namespace, tuning=WatchTuning()
    )

    def allowed() -> bool:
        try:
            port.http.get(HPAS.format(ns=namespace))
        except ApiException as error:
            if error.status == 403:
                return False  # the binding is not in the authorizer's cache yet
            raise
        return True

    wait_until(allowed, timeout=30, what="the role to take effect")
    return port


class Scene:
    """The watcher (with its autoscaler listing) and an executor, on one namespace."""

    def __init__(self, admin: KubeHttp, namespace: str, bus: Bus) -> None:
        self.admin, self.namespace, self.bus = admin, namespace, bus
        self.announced: list[WorkloadChanged] = []
        self.sent = 0
        self.executor: Executor
        self.watcher: Watcher

    def latest(self, name: str) -> WorkloadChanged | None:
        found = [e for e in self.announced if e.workload.name == name]
        return found[-1] if found else None

    async def announced_as(self, name: str, check: Callable[[WorkloadChanged], bool]) -> Any:
        async def wait() -> WorkloadChanged:
            while True:
                event = self.latest(name)
                if event is not None and check(event):
                    return event
                await asyncio.sleep(0.05)

        return await asyncio.wait_for(wait(), WAIT)

    async def command(self, target: WorkloadRef, desired: int) -> Any:
        self.sent += 1
        return await self.executor.handle(
            ScaleCommand(
                target=target,
                desired=desired,
                reason="forecast needs more",
                plan_id=f"p{self.sent}",
                issued_at=T0 + timedelta(minutes=self.sent),
                idempotency_key=f"k{self.sent}",
            )
        )

    def replicas(self, name: str) -> int:
        obj = self.admin.get(f"{collection('Deployment', self.namespace)}/{name}")
        return int(obj["spec"]["replicas"])

    def events(self, name: str, reason: str) -> list[dict[str, Any]]:
        found = self.admin.get(f"/api/v1/namespaces/{self.namespace}/events")["items"]
        return [
            e
            for e in found
            if e.get("reason") == reason and e["involvedObject"].get("name") == name
        ]


@contextlib.asynccontextmanager
async def scene(
    admin: KubeHttp,
    namespace: str,
    bus: Bus,
    unique: str,
    make_kubeconfig: Callable[..., Path],
) -> AsyncIterator[Scene]:
    watcher_config = service_kubeconfig(admin, namespace, "watcher", make_kubeconfig)
    executor_config = service_kubeconfig(admin, namespace, "executor", make_kubeconfig)
    install_keda_crd(admin, namespace)
    watcher_port = await asyncio.to_thread(port_as, watcher_config, namespace)
    executor_port = await asyncio.to_thread(port_as, executor_config, namespace)
    found = Scene(admin, namespace, bus)
    found.watcher = Watcher(watcher_port, bus, bucket=f"snap_{unique}")
    found.executor = Executor(
        executor_port,
        RecordStore(await bus.kv(f"exec_{unique}")),
        name="test",
        events=executor_port,
        autoscalers=executor_port.autoscalers(),
    )
    stopping = asyncio.Event()
    ready = asyncio.Event()

    async def collect() -> None:
        subject = WORKLOAD_CHANGED.filter(namespace=namespace)
        async for envelope in bus.subscribe(subject, consumer=f"t-{unique}"):
            found.announced.append(envelope.data)

    tasks = [
        asyncio.create_task(collect()),
        asyncio.create_task(found.watcher.run(ready)),
        asyncio.create_task(
            follow_autoscalers(watcher_port.autoscalers(), found.watcher, stopping, period_s=1.0)
        ),
    ]
    try:
        await asyncio.wait_for(ready.wait(), WAIT)
        yield found
    finally:
        stopping.set()
        for task in tasks:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await watcher_port.close()
        await executor_port.close()


def held_in_plan(event: WorkloadChanged) -> tuple[str, str]:
    """The plan's reason for the workload and `tideshift status`'s why, from the planner's own
    target book and plan output and the status picture."""
    book = TargetBook()
    book.apply(event)
    targets = book.targets({}, T0)
    assert [w.target for w in targets.serving] == []  # not planned: held
    empty = pol.Decision(targets=(), infeasible=(), fallbacks=(), node_usage=np.zeros((0, 3)))
    plan = plan_decided(empty, policy="test", plan_id="p", now=T0.timestamp(), held=targets.held)
    (item,) = plan.targets
    assert (item.current, item.desired) == (event.replicas, event.replicas)
    kept = picture.Kept(
        plan=plan, lease=None, statuses=(), results={}, workloads=[event], nodes=(), pods=()
    )
    (row,) = picture.picture(kept, T0).serving
    assert f"why: {row.why}" in picture.render(picture.picture(kept, T0))
    return item.reason, row.why


async def test_default_an_hpa_keeps_replicas_and_tideshift_says_why(
    admin: KubeHttp,
    k8s_namespace: str,
    bus: Bus,
    unique: str,
    k8s_service_account_kubeconfig: Callable[..., Path],
) -> None:
    ns = k8s_namespace
    target = WorkloadRef(ns, "Deployment.apps", "web")
    async with scene(admin, ns, bus, unique, k8s_service_account_kubeconfig) as s:
        create(admin, collection("Deployment", ns), serving("web", 1, {}))
        await s.announced_as("web", lambda e: not e.held_by)
        create(admin, HPAS.format(ns=ns), hpa("web", "web", low=2, high=6))

        # The watcher notices it: announced held, with the HPA named.
        event = await s.announced_as("web", lambda e: e.held_by.startswith(LEFT_TO))
        assert "HorizontalPodAutoscaler" in event.held_by and f"{ns}/web" in event.held_by
        reason, why = held_in_plan(event)
        assert reason == why == event.held_by
        wait_until(
            lambda: s.events("web", "TideshiftLeftToEngine"),
            timeout=WAIT,
            what="the watcher's Warning Event",
        )

        # The real HPA controller owns replicas: it raises 1 to its minReplicas 2.
        await asyncio.to_thread(
            wait_until, lambda: s.replicas("web") == 2, timeout=HPA_FOLLOW_S, what="HPA to 2"
        )
        # The plan would change them; the executor writes nothing, and says why.
        for desired in (5, 1):
            result = await s.command(target, desired)
            assert result.outcome == "rejected", result.message
            assert (
                result.message.startswith(LEFT_TO) and "HorizontalPodAutoscaler" in result.message
            )
            assert s.replicas("web") == 2
        warnings = s.events("web", LEFT_TO_AUTOSCALER_REASON)
        assert warnings and all(w["type"] == "Warning" for w in warnings)

        # The HPA deleted: announced free again, and the executor writes it.
        admin.json("DELETE", f"{HPAS.format(ns=ns)}/web")
        await s.announced_as("web", lambda e: not e.held_by)
        result = await s.command(target, 4)
        assert (result.outcome, result.current) == ("applied", 4), result.message
        assert s.replicas("web") == 4


async def test_steer_raises_the_hpas_minimum_and_the_hpa_controller_follows(
    admin: KubeHttp,
    k8s_namespace: str,
    bus: Bus,
    unique: str,
    k8s_service_account_kubeconfig: Callable[..., Path],
) -> None:
    ns = k8s_namespace
    target = WorkloadRef(ns, "Deployment.apps", "api")
    annotations = {
        MODE_ANNOTATION: "steer",
        "tideshift.io/max-replicas": "8",
    }
    async with scene(admin, ns, bus, unique, k8s_service_account_kubeconfig) as s:
        create(admin, collection("Deployment", ns), serving("api", 1, annotations))
        create(admin, HPAS.format(ns=ns), hpa("api", "api", low=1, high=5))
        # Steered, not held: once the watcher has the HPA, the workload stays announced free
        # (the planner plans it; only the executor's write differs).
        await asyncio.to_thread(
            wait_until, lambda: s.watcher.autoscalers_of(target), timeout=WAIT, what="the HPA"
        )
        event = await s.announced_as("api", lambda e: True)
        assert event.held_by == ""

        result = await s.command(target, 4)
        assert result.outcome == "applied", result.message
        assert "minReplicas 1 -> 4, maxReplicas 5 -> 8" in result.message
        written = admin.get(f"{HPAS.format(ns=ns)}/api")["spec"]
        assert (written["minReplicas"], written["maxReplicas"]) == (4, 8)
        # Tideshift wrote no replicas; the real HPA controller moves them to its new minimum.
        await asyncio.to_thread(
            wait_until,
            lambda: s.replicas("api") == 4,
            timeout=HPA_FOLLOW_S,
            what="the HPA controller to raise replicas to minReplicas 4",
        )
        assert s.events("api", STEERED_REASON)
        # The same plan again: the HPA is already there, nothing is written.
        again = await s.command(target, 4)
        assert again.outcome == "noop", again.message


async def test_a_scaled_object_is_honoured_or_steered_and_a_bad_one_skipped(
    admin: KubeHttp,
    k8s_namespace: str,
    bus: Bus,
    unique: str,
    k8s_service_account_kubeconfig: Callable[..., Path],
) -> None:
    ns = k8s_namespace
    target = WorkloadRef(ns, "Deployment.apps", "queue")
    skipped = SKIPPED.labels("ScaledObject")._value.get()
    async with scene(admin, ns, bus, unique, k8s_service_account_kubeconfig) as s:
        create(admin, collection("Deployment", ns), serving("queue", 3, {}))
        # The CRD takes it (maxReplicaCount >= 0) but KEDA needs at least 1: unreadable.
        create(
            admin, SCALED_OBJECTS.format(ns=ns), scaled_object("bad", "queue", maxReplicaCount=0)
        )
        create(admin, SCALED_OBJECTS.format(ns=ns), scaled_object("queue-so", "queue"))

        event = await s.announced_as("queue", lambda e: e.held_by.startswith(LEFT_TO))
        assert f"ScaledObject {ns}/queue-so" in event.held_by and "bad" not in event.held_by
        assert SKIPPED.labels("ScaledObject")._value.get() > skipped
        result = await s.command(target, 6)
        assert result.outcome == "rejected" and "ScaledObject" in result.message
        assert s.replicas("queue") == 3

        admin.json("DELETE", f"{SCALED_OBJECTS.format(ns=ns)}/queue-so")
        await s.announced_as("queue", lambda e: not e.held_by)

        # Steered, a ScaledObject gets its minReplicaCount/maxReplicaCount (KEDA is not built:
        # nothing follows them here; the write and the executor's role are what is shown).
        steer = {MODE_ANNOTATION: "steer"}
        create(admin, collection("Deployment", ns), serving("worker", 1, steer))
        create(admin, SCALED_OBJECTS.format(ns=ns), scaled_object("worker-so", "worker"))
        result = await s.command(WorkloadRef(ns, "Deployment.apps", "worker"), 5)
        assert result.outcome == "applied", result.message
        assert "minReplicaCount 0 -> 5, maxReplicaCount 100" in result.message
        written = admin.get(f"{SCALED_OBJECTS.format(ns=ns)}/worker-so")["spec"]
        assert (written["minReplicaCount"], written["maxReplicaCount"]) == (5, 100)
        assert s.replicas("worker") == 1


# -- the whole loop: watcher, planner and executor as processes (tests/k8s/test_workloads_e2e.py's
# harness, a module of its own here), `tideshift status` as a user runs it ----------------------


loop = e2e.loop  # its module-scoped fixture: the services, run for this module's last test


@pytest.fixture(scope="module")
def quick_listing() -> Iterator[None]:
    """The loop's watcher lists autoscalers every second (its environment, set before the
    loop's processes start: ask for this fixture first)."""
    os.environ[LISTING_PERIOD_ENV] = "1"
    try:
        yield
    finally:
        os.environ.pop(LISTING_PERIOD_ENV, None)


def status_json(loop: Loop) -> dict[str, Any]:
    done = subprocess.run(
        tideshift("status", "-o", "json", "--nats-url", loop.nats_url),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    return dict(json.loads(done.stdout))


def why_of(loop: Loop, name: str) -> str:
    rows = [r for r in status_json(loop)["serving"] if r["target"].endswith(f"/{name}")]
    return str(rows[0]["why"]) if rows else ""


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_the_running_services_leave_an_hpas_workload_alone_and_resume(
    quick_listing: None, loop: Loop
) -> None:
    """The loop's web Deployment, planned at its forecast, gets an HPA whose minimum is above
    the plan: the watcher's announcement holds it, the planner's plan and `tideshift status`
    give the HPA as the reason, the HPA controller's count stands against a plan that wants
    fewer; the HPA deleted, the planner sizes it again (down to what the forecast needs)."""
    name, hpas = "web", HPAS.format(ns=loop.namespace)
    ((_, planned),) = asyncio.run(decisions_in_plans(loop.nats_url, name, plans=1))
    loop.eventually(lambda: loop.get("Deployment", name)["spec"]["replicas"] == planned, "web")
    low = planned + 2
    create(loop.admin, hpas, hpa("web-hpa", name, low=low, high=low + 2))

    # The real HPA controller raises replicas to its minimum; the plan, which wants `planned`,
    # holds web where the HPA puts it, and gives the HPA as the reason, plan after plan.
    loop.eventually(lambda: loop.get("Deployment", name)["spec"]["replicas"] == low, "HPA's count")
    held = asyncio.run(decisions_in_plans(loop.nats_url, name, plans=3, after=LEFT_TO))
    assert all(r.startswith(LEFT_TO) and d == low for r, d in held), held
    assert f"HorizontalPodAutoscaler {loop.namespace}/web-hpa" in held[0][0]
    assert why_of(loop, name) == held[-1][0]  # `tideshift status` says it too
    assert loop.get("Deployment", name)["spec"]["replicas"] == low

    loop.admin.json("DELETE", f"{hpas}/web-hpa")
    loop.eventually(
        lambda: loop.get("Deployment", name)["spec"]["replicas"] == planned,
        "the planner to size web again",
    )


async def decisions_in_plans(
    nats_url: str, name: str, *, plans: int, after: str = ""
) -> list[tuple[str, int]]:
    """The (reason, desired) of `name` in the next `plans` plans, from the first whose
    reason begins with `after`."""
    bus = await Bus.connect(nats_url, name="e2e-autoscalers")
    found: list[tuple[str, int]] = []
    try:
        async with asyncio.timeout(WAIT):
            async for envelope in bus.subscribe(PLAN_DECIDED.filter(), consumer="e2e-hpa"):
                for item in envelope.data.targets:
                    if item.target.name == name and (found or item.reason.startswith(after)):
                        found.append((item.reason, item.desired))
                if len(found) >= plans:
                    break
    finally:
        await bus.close()
    return found
