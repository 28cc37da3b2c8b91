"""Valid objects and commands at the edges of what Kubernetes and the contract allow, against
the watcher, planner and executor running as processes (`tideshift run ...`) on a real
nats-server and the local control plane (issue 25, Definition of done).

The watcher and the executor run as ServiceAccounts bound to exactly their roles of the chart's
RBAC manifest. Watcher cases are objects: the longest legal names, extreme annotation values,
pod status times from 1970 and 9999, a flood of objects nobody announced. Executor cases are
scale commands: int32-max replicas, the longest names and idempotency keys, a flood for
unknown targets, commands issued in year 9999 and 1970, duplicates. After every case a fresh
labelled Deployment is announced, planned and scaled in the apiserver (each idempotency key
applied once), every /healthz and /readyz answers 200 and no service grew past the bound.
Runtime: ~40 s for the nine cases (plus the control plane's start), ~2 min on a loaded machine.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from kubernetes.client.exceptions import ApiException

from tests.fuzz.hostile import Recorder, Services, start_service
from tests.k8s.cluster_objects import (
    collection,
    create,
    deployment,
    pod_template,
    service_kubeconfig,
    wait_until,
)
from tideshift.events import (
    FORECAST,
    POD_CHANGED,
    SCALE_COMMAND,
    SCALE_RESULT,
    SNAPSHOT_BUCKET,
    WORKLOAD_CHANGED,
    ForecastIssued,
    ForecastPoint,
    PodChanged,
    ScaleCommand,
    ScaleResult,
    WorkloadRef,
)
from tideshift.services.cluster.adapters.http import MERGE_PATCH, KubeHttp
from tideshift.services.common.bus import Bus
from tideshift.services.common.embedded_nats import EmbeddedNats
from tideshift.services.watcher.core.snapshot import pod_key

pytestmark = [pytest.mark.k8s, pytest.mark.slow]

WAIT = 60.0
KIND = "Deployment.apps"
INT32_MAX = 2**31 - 1
# Objects the flood creates, and the time it may take to create them (each is one POST).
FLOOD_PODS, FLOOD_DEPLOYMENTS, FLOOD_BUDGET_S = 200, 60, 90.0
UNKNOWN_TARGETS = 300


def longest_name(last: str) -> str:
    """A 253-character DNS subdomain using every legal kind of character (a-z, 0-9, '-', '.')."""
    return ("edge-0.name9-" * 20)[:252] + last


@dataclass
class Chain:
    admin: KubeHttp
    url: str
    services: Services
    edge_namespace: str  # 63 characters

    def target(self, name: str, namespace: str | None = None) -> WorkloadRef:
        return WorkloadRef(namespace or self.edge_namespace, KIND, name)


def make_namespace(admin: KubeHttp, name: str) -> None:
    body = {"metadata": {"name": name, "labels": {"tideshift.io/test": "hostile"}}}
    create(admin, "/api/v1/namespaces", body)


def delete_namespace(admin: KubeHttp, name: str) -> None:
    try:
        admin.json("DELETE", f"/api/v1/namespaces/{name}")
    except ApiException as error:
        if error.status != 404:
            raise


def executor_may_scale(admin: KubeHttp, namespace: str) -> bool:
    review = admin.json(
        "POST",
        "/apis/authorization.k8s.io/v1/subjectaccessreviews",
        body={
            "apiVersion": "authorization.k8s.io/v1",
            "kind": "SubjectAccessReview",
            "spec": {
                "user": f"system:serviceaccount:{namespace}:executor",
                "resourceAttributes": {
                    "group": "apps",
                    "resource": "deployments",
                    "subresource": "scale",
                    "verb": "update",
                },
            },
        },
    )
    return bool(review.get("status", {}).get("allowed"))


def serving(name: str, replicas: int, annotations: dict[str, str]) -> dict[str, Any]:
    """A Deployment that joined Tideshift as serving (the role label on the object itself)."""
    body = deployment(name, replicas, annotations=annotations)
    body["metadata"]["labels"] = {"tideshift.io/role": "serving"}
    return body


def unlabelled(name: str, replicas: int = 1, annotations: dict[str, str] | None = None) -> Any:
    """A Deployment without the role label (label values are at most 63 characters)."""
    body = deployment(f"u{uuid.uuid4().hex[:8]}", replicas, annotations=annotations)
    body["metadata"]["name"] = name
    del body["spec"]["template"]["metadata"]["labels"]["tideshift.io/role"]
    return body


@pytest.fixture(scope="module")
def chain(k8s_cluster: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Chain]:
    logs = tmp_path_factory.mktemp("hostile-k8s")
    home = f"hostile-{uuid.uuid4().hex[:6]}"
    edge = f"{home}-" + "x" * (63 - len(home) - 1)
    managed = [f"{KIND}/{edge}/{name}" for name in (longest_name("1"), "cap", "dup", "clock")]
    with k8s_cluster.api_client() as api_client, EmbeddedNats() as nats:
        admin = KubeHttp(api_client)
        make_namespace(admin, home)

        def kubeconfig(namespace: str, account: str) -> Path:
            path = logs / f"{account}.kubeconfig"
            return Path(k8s_cluster.service_account_kubeconfig(namespace, account, path))

        watcher = service_kubeconfig(admin, home, "watcher", kubeconfig)
        executor = service_kubeconfig(admin, home, "executor", kubeconfig)
        wait_until(lambda: executor_may_scale(admin, home), what="the executor role to bind")
        make_namespace(admin, edge)
        for name in ("cap", "dup", "clock", "unlisted", longest_name("1")):
            bounds = {"tideshift.io/max-replicas": "3"} if name == "cap" else {}
            create(admin, collection(KIND, edge), unlabelled(name, annotations=bounds))
        listed = ["--managed-targets", json.dumps(managed)]
        argvs = {
            "watcher": ["--kubeconfig", str(watcher)],
            "planner": ["--instance", "hostile-k8s", "--tick-seconds", "1"],
            # A bounded step per command: the extreme annotations include a legal
            # min-replicas of 2^31-1, and the control plane would start creating those pods.
            "executor": ["--kubeconfig", str(executor), "--max-step", "5", *listed],
        }
        services = Services({n: start_service(n, nats.url, logs, a) for n, a in argvs.items()})
        try:
            services.wait_ready(WAIT * 2)
            yield Chain(admin, nats.url, services, edge)
        finally:
            services.stop()
            for namespace in (home, edge):
                delete_namespace(admin, namespace)


def replicas_of(admin: KubeHttp, target: WorkloadRef) -> int:
    return int(admin.get(f"{collection(KIND, target.namespace)}/{target.name}")["spec"]["replicas"])


def forecast(target: WorkloadRef, rps: float) -> ForecastIssued:
    now = datetime.now(UTC)
    points = tuple(
        ForecastPoint(
            at=now + timedelta(seconds=60 * k), point=rps, q50=rps, q90=rps, q95=rps, q99=rps
        )
        for k in range(10)
    )
    return ForecastIssued(workload=target, issued_at=now, step_seconds=60, model="m", points=points)


def command(
    target: WorkloadRef, desired: int, key: str, issued_at: datetime | None = None
) -> ScaleCommand:
    return ScaleCommand(
        target=target,
        desired=desired,
        reason="hostile",
        plan_id="hostile",
        issued_at=issued_at or datetime.now(UTC),
        idempotency_key=key,
        issuer="operator",
    )


def applied_once(results: list[ScaleResult]) -> list[ScaleResult]:
    """The applied results, each idempotency key at most once (a doubled write fails here)."""
    applied = [r for r in results if r.outcome == "applied"]
    keys = [r.idempotency_key for r in applied]
    assert len(keys) == len(set(keys)), keys
    return applied


async def planned_and_scaled(chain: Chain, bus: Bus, namespace: str, body: dict[str, Any]) -> int:
    """Create a labelled Deployment, wait for its one announcement, forecast 100 req/s for it
    and wait until the executor applied a scale-up: the replicas the apiserver holds."""
    name = body["metadata"]["name"]
    announced = await Recorder(bus, WORKLOAD_CHANGED.filter(namespace=namespace)).start()
    results = await Recorder(bus, SCALE_RESULT.filter(namespace=namespace)).start()
    await asyncio.to_thread(create, chain.admin, collection(KIND, namespace), body)
    added = await announced.wait_for(
        lambda seen: [e for e in seen if e.workload.name == name], WAIT, f"announcement of {name}"
    )
    target = added[0].workload
    await bus.publish(FORECAST.at(namespace=namespace, workload=name), forecast(target, 100.0))
    await results.wait_for(
        lambda seen: [r for r in seen if r.outcome == "applied" and r.target.name == name],
        WAIT,
        f"an applied scale of {name}",
    )
    applied = applied_once(results.seen)
    replicas = await asyncio.to_thread(replicas_of, chain.admin, target)
    # 100 req/s at 10 each, at most 4: sized up, never past the bound (a doubled write would be).
    assert 1 < replicas <= 4 and replicas in {r.current for r in applied}, (replicas, applied)
    adds = [e for e in announced.seen if e.workload.name == name and e.change == "added"]
    assert len(adds) == 1, announced.seen
    return replicas


async def after_the_case(chain: Chain) -> None:
    """A fresh labelled Deployment is still announced, planned and scaled; health is true."""
    namespace = f"fresh-{uuid.uuid4().hex[:8]}"
    await asyncio.to_thread(make_namespace, chain.admin, namespace)
    bus = await Bus.connect(chain.url, name="hostile-k8s-check")
    try:
        annotations = {"tideshift.io/capacity-rps": "10", "tideshift.io/max-replicas": "4"}
        await planned_and_scaled(chain, bus, namespace, serving("web", 1, annotations))
    finally:
        await bus.close()
        await asyncio.to_thread(delete_namespace, chain.admin, namespace)
    await asyncio.to_thread(chain.services.healthy)


# -- the watcher: objects at the edges ------------------------------------------------------


async def test_the_longest_names_are_announced_planned_and_scaled(chain: Chain) -> None:
    name = longest_name("2")
    bounds = {"tideshift.io/capacity-rps": "10", "tideshift.io/max-replicas": "4"}
    body = serving("longest", 1, bounds)
    body["metadata"]["name"] = name
    bus = await Bus.connect(chain.url, name="hostile-k8s")
    try:
        await planned_and_scaled(chain, bus, chain.edge_namespace, body)
    finally:
        await bus.close()
    await after_the_case(chain)


EXTREME_ANNOTATIONS: list[tuple[str, str]] = [
    ("capacity-rps", "5e-324"),
    ("capacity-rps", "1e308"),
    ("capacity-rps", "inf"),
    ("capacity-rps", "nan"),
    ("capacity-rps", "-1"),
    ("capacity-rps", "\uff11\uff10"),  # fullwidth "10": Python's float() reads it
    ("capacity-rps", "1_0"),
    ("min-replicas", str(INT32_MAX)),
    ("min-replicas", str(INT32_MAX + 1)),
    ("min-replicas", "-1"),
    ("max-replicas", str(INT32_MAX)),
    ("max-replicas", "0"),
    ("lead-time-seconds", "1e308"),
    ("quantile", "0.9999999999999999"),
    ("quantile", "1"),
    ("stabilization-seconds", "1e308"),
    ("demand-query", "q" * 100_000),
]


async def test_extreme_annotation_values_are_announced_or_refused_and_told(chain: Chain) -> None:
    """Each object is announced with a policy the contract holds, or refused with a Warning
    Event naming the annotation; the watcher goes on with the rest."""
    namespace = f"extreme-{uuid.uuid4().hex[:6]}"
    await asyncio.to_thread(make_namespace, chain.admin, namespace)
    bus = await Bus.connect(chain.url, name="hostile-k8s")
    try:
        announced = await Recorder(bus, WORKLOAD_CHANGED.filter(namespace=namespace)).start()
        names = {}
        for index, (key, value) in enumerate(EXTREME_ANNOTATIONS):
            annotations = {"tideshift.io/capacity-rps": "10", f"tideshift.io/{key}": value}
            names[f"e{index}"] = key
            await asyncio.to_thread(
                create,
                chain.admin,
                collection(KIND, namespace),
                serving(f"e{index}", 0, annotations),
            )

        def told() -> set[str]:
            items = chain.admin.get(f"/api/v1/namespaces/{namespace}/events")["items"]
            return {
                e["involvedObject"]["name"]
                for e in items
                if e.get("reason") == "TideshiftInvalidPolicy"
                and names.get(e["involvedObject"]["name"], "?") in e.get("message", "")
            }

        async def settled() -> set[str]:
            both = {e.workload.name for e in announced.seen} | await asyncio.to_thread(told)
            return set(names) - both

        deadline = asyncio.get_running_loop().time() + WAIT
        while missing := await settled():
            assert asyncio.get_running_loop().time() < deadline, (
                f"neither announced nor told: {missing}"
            )
            await asyncio.sleep(0.5)
    finally:
        await bus.close()
        await asyncio.to_thread(delete_namespace, chain.admin, namespace)
    await after_the_case(chain)


def unschedulable_pod(name: str) -> dict[str, Any]:
    template = pod_template({"app": "flood"})
    template["spec"]["nodeSelector"] = {"tideshift.io/hostile": "nowhere"}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": template["spec"]}


async def test_pod_times_from_1970_and_9999_do_not_outlive_its_deletion(chain: Chain) -> None:
    """Status times are the only ones a client can forge (the apiserver stamps metadata):
    a pod claiming to start in 9999 is published, and its deletion still wins."""
    namespace = f"times-{uuid.uuid4().hex[:6]}"
    await asyncio.to_thread(make_namespace, chain.admin, namespace)
    bus = await Bus.connect(chain.url, name="hostile-k8s")
    pods = f"/api/v1/namespaces/{namespace}/pods"
    try:
        seen = await Recorder(bus, POD_CHANGED.filter(namespace=namespace)).start()
        await asyncio.to_thread(create, chain.admin, pods, unschedulable_pod("timeless"))
        status = {
            "status": {
                "startTime": "9999-12-31T23:59:59Z",
                "conditions": [
                    {
                        "type": "PodScheduled",
                        "status": "False",
                        "lastTransitionTime": "1970-01-01T00:00:00Z",
                    }
                ],
            }
        }
        await asyncio.to_thread(
            chain.admin.json,
            "PATCH",
            f"{pods}/timeless/status",
            body=status,
            content_type=MERGE_PATCH,
        )
        await seen.wait_for(lambda s: s, WAIT, "the pod published")
        await asyncio.to_thread(
            chain.admin.json, "DELETE", f"{pods}/timeless", body={"gracePeriodSeconds": 0}
        )
        await seen.wait_for(lambda s: [e for e in s if e.change == "deleted"], WAIT, "its deletion")
        snapshot = await bus.kv(SNAPSHOT_BUCKET)

        async def gone() -> bool:
            return await snapshot.get(pod_key(namespace, "timeless"), PodChanged) is None

        deadline = asyncio.get_running_loop().time() + WAIT
        while not await gone():
            assert asyncio.get_running_loop().time() < deadline, (
                "the deleted pod stayed in the snapshot"
            )
            await asyncio.sleep(0.2)
    finally:
        await bus.close()
        await asyncio.to_thread(delete_namespace, chain.admin, namespace)
    await after_the_case(chain)


async def test_a_flood_of_unannounced_objects_passes(chain: Chain) -> None:
    """Pods, unlabelled Deployments and labelled ones nobody forecasts, created as fast as the
    apiserver takes them (bounded count and time): every pod is published once added."""
    namespace = f"flood-{uuid.uuid4().hex[:6]}"
    await asyncio.to_thread(make_namespace, chain.admin, namespace)
    bus = await Bus.connect(chain.url, name="hostile-k8s")
    deployments = collection(KIND, namespace)
    bodies = [
        (f"/api/v1/namespaces/{namespace}/pods", unschedulable_pod(f"p-{i}"))
        for i in range(FLOOD_PODS)
    ]
    bodies += [(deployments, unlabelled(f"u-{i}", 0)) for i in range(FLOOD_DEPLOYMENTS)]
    labelled = {"tideshift.io/capacity-rps": "10"}
    bodies += [(deployments, serving(f"l-{i}", 0, labelled)) for i in range(FLOOD_DEPLOYMENTS)]
    try:
        pods = await Recorder(bus, POD_CHANGED.filter(namespace=namespace)).start()

        def flood() -> None:
            with ThreadPoolExecutor(8) as pool:
                list(pool.map(lambda item: create(chain.admin, *item), bodies))

        await asyncio.wait_for(asyncio.to_thread(flood), FLOOD_BUDGET_S)
        await pods.wait_for(
            lambda seen: len({e.name for e in seen if e.change == "added"}) == FLOOD_PODS,
            WAIT,
            f"all {FLOOD_PODS} pods published",
        )
    finally:
        await bus.close()
        await asyncio.to_thread(delete_namespace, chain.admin, namespace)
    await after_the_case(chain)


# -- the executor: commands at the edges ----------------------------------------------------


async def results_for(chain: Chain, bus: Bus, target: WorkloadRef) -> Recorder[ScaleResult]:
    subject = SCALE_RESULT.filter(namespace=target.namespace)
    return await Recorder(bus, subject).start()


def of(target: WorkloadRef, seen: list[ScaleResult]) -> list[ScaleResult]:
    return [r for r in seen if r.target.name == target.name]


async def send(bus: Bus, *commands: ScaleCommand) -> None:
    for item in commands:
        subject = SCALE_COMMAND.at(
            namespace=item.target.namespace, kind=item.target.kind, name=item.target.name
        )
        await bus.publish_durable(subject, item)


async def test_int32_max_replicas_are_clamped_or_refused(chain: Chain) -> None:
    cap, unlisted = chain.target("cap"), chain.target("unlisted")
    bus = await Bus.connect(chain.url, name="hostile-k8s")
    try:
        results = await results_for(chain, bus, cap)
        await send(
            bus,
            command(cap, INT32_MAX, f"max-{uuid.uuid4().hex}"),
            command(unlisted, INT32_MAX, f"max-{uuid.uuid4().hex}"),
        )
        done = await results.wait_for(
            lambda seen: len(of(cap, seen)) >= 1 and len(of(unlisted, seen)) >= 1,
            WAIT,
            "both results",
        )
        assert done
        (capped,), (refused,) = of(cap, results.seen), of(unlisted, results.seen)
        # Its max-replicas annotation (3) bounds it; max-step (5) would too.
        assert capped.outcome == "applied" and capped.current == 3, capped
        assert refused.outcome == "rejected" and "not managed" in refused.message, refused
        assert await asyncio.to_thread(replicas_of, chain.admin, cap) == 3
        assert await asyncio.to_thread(replicas_of, chain.admin, unlisted) == 1
    finally:
        await bus.close()
    await after_the_case(chain)


async def test_the_longest_name_and_key_are_applied_once(chain: Chain) -> None:
    target = chain.target(longest_name("1"))
    key = (uuid.uuid4().hex * 8)[:256]
    bus = await Bus.connect(chain.url, name="hostile-k8s")
    try:
        results = await results_for(chain, bus, target)
        await send(bus, command(target, 2, key), command(target, 2, key))
        await results.wait_for(lambda seen: len(of(target, seen)) >= 2, WAIT, "two results")
        outcomes = sorted(r.outcome for r in of(target, results.seen))
        assert outcomes == ["applied", "noop"], of(target, results.seen)
        assert await asyncio.to_thread(replicas_of, chain.admin, target) == 2
    finally:
        await bus.close()
    await after_the_case(chain)


async def test_a_flood_of_commands_for_unknown_targets_is_refused(chain: Chain) -> None:
    namespace = f"nowhere-{uuid.uuid4().hex[:6]}"
    targets = [
        WorkloadRef(namespace, KIND, longest_name(str(i % 10))[:-3] + f"{i:03d}")
        for i in range(UNKNOWN_TARGETS)
    ]
    bus = await Bus.connect(chain.url, name="hostile-k8s")
    try:
        results = await Recorder(bus, SCALE_RESULT.filter(namespace=namespace)).start()
        await send(bus, *(command(t, INT32_MAX, f"u-{uuid.uuid4().hex}") for t in targets))
        await results.wait_for(lambda seen: len(seen) >= UNKNOWN_TARGETS, WAIT * 2, "every result")
        assert {r.outcome for r in results.seen} == {"rejected"}, results.seen[:3]
    finally:
        await bus.close()
    await after_the_case(chain)


async def test_commands_from_9999_and_1970_hold_nothing_for_long(chain: Chain) -> None:
    """Year 9999 is taken as now + the executor's skew (30 s): a command issued later than
    that is applied; one from 1970 is stale."""
    target = chain.target("clock")
    now = datetime.now(UTC)
    bus = await Bus.connect(chain.url, name="hostile-k8s")
    try:
        results = await results_for(chain, bus, target)
        await send(
            bus,
            command(target, 2, f"future-{uuid.uuid4().hex}", datetime(9999, 12, 31, tzinfo=UTC)),
            command(target, 4, f"past-{uuid.uuid4().hex}", datetime(1970, 1, 1, tzinfo=UTC)),
            command(target, 3, f"later-{uuid.uuid4().hex}", now + timedelta(seconds=90)),
        )
        await results.wait_for(lambda seen: len(of(target, seen)) >= 3, WAIT, "three results")
        by_kind = {r.idempotency_key.split("-")[0]: r for r in of(target, results.seen)}
        future, past, later = by_kind["future"], by_kind["past"], by_kind["later"]
        assert (future.outcome, future.current) == ("applied", 2), future
        assert past.outcome == "noop" and past.message.startswith("stale"), past
        assert (later.outcome, later.current) == ("applied", 3), later
        assert await asyncio.to_thread(replicas_of, chain.admin, target) == 3
    finally:
        await bus.close()
    await after_the_case(chain)


async def test_duplicate_commands_are_applied_once(chain: Chain) -> None:
    target = chain.target("dup")
    key = f"dup-{uuid.uuid4().hex}"
    bus = await Bus.connect(chain.url, name="hostile-k8s")
    try:
        results = await results_for(chain, bus, target)
        await send(bus, *[command(target, 4, key)] * 20)
        await results.wait_for(lambda seen: len(of(target, seen)) >= 20, WAIT, "twenty results")
        assert len(applied_once(of(target, results.seen))) == 1
        assert await asyncio.to_thread(replicas_of, chain.admin, target) == 4
    finally:
        await bus.close()
    await after_the_case(chain)
