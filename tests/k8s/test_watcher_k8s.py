"""The watcher against a real control plane and a real nats-server.

It runs as a ServiceAccount bound to exactly the `tideshift-watcher` ClusterRole of
charts/tideshift/files/rbac.yaml, so every test also proves that role is sufficient.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
import urllib.request
import uuid
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
from kubernetes.client.exceptions import ApiException

from tests.k8s.cluster_objects import (
    collection,
    create,
    deployment,
    pod_template,
    pytorch_job,
    service_kubeconfig,
    statefulset,
    volcano_job,
    wait_until,
)
from tideshift.events import NODE_CHANGED, POD_CHANGED, NodeChanged, PodChanged
from tideshift.services.cluster import kubernetes
from tideshift.services.cluster.adapters.http import KubeHttp
from tideshift.services.cluster.informer import RELISTS, WATCH_ERRORS, WatchTuning
from tideshift.services.cluster.kubernetes import KubernetesClusterPort
from tideshift.services.cluster.port import ClusterChange, Pod
from tideshift.services.common.bus import Bus
from tideshift.services.devcluster.nodes import NodeSpec
from tideshift.services.watcher.core.snapshot import node_key, pod_key
from tideshift.services.watcher.watcher import STALE, Watcher

pytestmark = pytest.mark.k8s
WAIT = 60.0


@pytest.fixture
def watcher_kubeconfig(
    admin: KubeHttp, k8s_namespace: str, k8s_service_account_kubeconfig: Callable[..., Path]
) -> Path:
    return service_kubeconfig(admin, k8s_namespace, "watcher", k8s_service_account_kubeconfig)


def watcher_port(kubeconfig: Path, namespace: str, **tuning: Any) -> KubernetesClusterPort:
    port = KubernetesClusterPort.from_kubeconfig(
        kubeconfig, namespace=namespace, tuning=WatchTuning(**tuning)
    )

    def allowed() -> bool:
        try:
            port.http.get(f"/api/v1/namespaces/{namespace}/pods")
        except ApiException as error:
            if error.status == 403:
                return False  # the binding is not in the authorizer's cache yet
            raise
        return True

    wait_until(allowed, timeout=30, what="the watcher role to take effect")
    return port


async def collect(iterator: AsyncIterator[Any], into: list[Any]) -> None:
    async for item in iterator:
        into.append(item)


@contextlib.asynccontextmanager
async def running(coroutine: Any) -> AsyncIterator[asyncio.Task[Any]]:
    task = asyncio.ensure_future(coroutine)
    try:
        yield task
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def eventually(check: Callable[[], Any], what: str, timeout: float = WAIT) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")
        await asyncio.sleep(0.05)


def counter(metric: Any, *labels: str) -> float:
    return float(metric.labels(*labels)._value.get())


async def test_nodes_and_pod_lifecycle_with_owners_and_roles(
    k8s_cluster: Any,
    admin: KubeHttp,
    k8s_namespace: str,
    watcher_kubeconfig: Path,
    bus: Bus,
    unique: str,
) -> None:
    namespace = k8s_namespace
    port = await asyncio.to_thread(watcher_port, watcher_kubeconfig, namespace)
    bucket = f"snap_{unique}"
    watcher = Watcher(port, bus, bucket=bucket)
    pods: list[Any] = []
    nodes: list[Any] = []
    ready = asyncio.Event()
    node_name = f"watch-node-{unique}"
    try:
        async with (
            running(
                collect(bus.subscribe(POD_CHANGED.filter(namespace=namespace), consumer="t"), pods)
            ),
            running(collect(bus.subscribe(NODE_CHANGED.filter(), consumer="t"), nodes)),
            running(watcher.run(ready)),
        ):
            await asyncio.wait_for(ready.wait(), WAIT)
            await asyncio.to_thread(k8s_cluster.create_nodes, [NodeSpec(node_name, cpu="4")])
            added: NodeChanged = (
                await eventually(
                    lambda: [e.data for e in nodes if e.data.name == node_name],
                    "the node's event",
                )
            )[0]
            assert added.change == "added" and added.allocatable.cpu == 4

            # A Deployment's pods carry the Deployment (through its ReplicaSet) and the role.
            await asyncio.to_thread(
                create, admin, collection("Deployment", namespace), deployment("web", 2)
            )
            # Training controllers we do not run: pods owned by their objects directly.
            owners = {}
            for kind, body in (
                ("Job.batch.volcano.sh", volcano_job("vc", workers=1, min_available=1)),
                ("PyTorchJob", pytorch_job("pt", workers=1, low=1, high=2)),
                ("StatefulSet", statefulset("db", 0)),
            ):
                made = await asyncio.to_thread(create, admin, collection(kind, namespace), body)
                owners[kind] = made
            for kind in ("Job.batch.volcano.sh", "PyTorchJob"):
                owner = owners[kind]
                pod = {
                    "apiVersion": "v1",
                    "kind": "Pod",
                    "metadata": {
                        "name": f"{owner['metadata']['name']}-worker-0",
                        "ownerReferences": [
                            {
                                "apiVersion": owner["apiVersion"],
                                "kind": owner["kind"],
                                "name": owner["metadata"]["name"],
                                "uid": owner["metadata"]["uid"],
                                "controller": True,
                            }
                        ],
                    },
                    "spec": pod_template({})["spec"],
                }
                await asyncio.to_thread(create, admin, f"/api/v1/namespaces/{namespace}/pods", pod)

            def latest() -> dict[str, PodChanged]:
                return {e.data.name: e.data for e in pods}

            def web_running() -> list[PodChanged]:
                return [
                    p
                    for p in latest().values()
                    if p.owner is not None
                    and p.owner.kind == "Deployment.apps"
                    and p.phase == "Running"
                    and p.node
                ]

            web = await eventually(
                lambda: len(web_running()) == 2 and web_running(), "web pods running"
            )
            assert all(p.owner is not None and p.owner.name == "web" for p in web)
            assert all(p.role == "serving" and p.requests.cpu == pytest.approx(0.1) for p in web)
            by_name = await eventually(
                lambda: {"vc-worker-0", "pt-worker-0"} <= set(latest()) and latest(),
                "training pods",
            )
            volcano = by_name["vc-worker-0"]
            assert volcano.owner is not None
            assert volcano.owner.kind == "Job.batch.volcano.sh"
            assert volcano.role == "training"
            assert by_name["pt-worker-0"].owner is not None
            assert by_name["pt-worker-0"].owner.kind == "PyTorchJob.kubeflow.org"

            # The snapshot holds what the events said.
            await watcher.flushed()
            snapshot = await bus.kv(bucket)
            stored = await snapshot.get(pod_key(namespace, web[0].name), PodChanged)
            assert stored is not None and stored.node == web[0].node
            assert await snapshot.get(node_key(node_name), NodeChanged) is not None

            # Deletion: the Deployment's pods go, with deleted events, and leave the snapshot.
            await asyncio.to_thread(
                admin.json,
                "DELETE",
                f"{collection('Deployment', namespace)}/web",
                body={"propagationPolicy": "Foreground"},
            )
            await eventually(
                lambda: (
                    {p.name for p in web}
                    <= {e.data.name for e in pods if e.data.change == "deleted"}
                ),
                "web pods deleted",
            )
            await asyncio.to_thread(k8s_cluster.delete_nodes, [node_name])
            await eventually(
                lambda: any(e.data.name == node_name and e.data.change == "deleted" for e in nodes),
                "node deleted",
            )
            await watcher.flushed()
            assert await snapshot.get(pod_key(namespace, web[0].name), PodChanged) is None
            assert await snapshot.get(node_key(node_name), NodeChanged) is None
    finally:
        await port.close()


class Recorder:
    def __init__(self, port: KubernetesClusterPort) -> None:
        self.port = port
        self.changes: list[ClusterChange] = []

    @contextlib.asynccontextmanager
    async def watching(self) -> AsyncIterator[None]:
        async def pump() -> None:
            async for change in self.port.watch():
                self.changes.append(change)

        async with running(pump()):
            yield

    def pods(self) -> list[tuple[str, str]]:
        return [(c.type, c.obj.name) for c in self.changes if isinstance(c.obj, Pod)]


def bare_pod(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": {"tideshift.io/role": "other"}},
        "spec": pod_template({})["spec"],
    }


def compact_etcd(etcd_url: str) -> None:
    """Compact etcd to its current revision: every older resourceVersion is gone."""

    def post(path: str, body: dict[str, Any]) -> dict[str, Any]:
        request = urllib.request.Request(
            etcd_url + path, data=json.dumps(body).encode(), method="POST"
        )
        with urllib.request.urlopen(request, timeout=10) as response:
            answer: dict[str, Any] = json.load(response)
            return answer

    revision = int(post("/v3/kv/range", {"key": "Lw=="})["header"]["revision"])
    post("/v3/kv/compaction", {"revision": revision, "physical": True})


async def test_a_forced_410_relists_without_losing_or_duplicating(
    k8s_cluster: Any, admin: KubeHttp, k8s_namespace: str, watcher_kubeconfig: Path
) -> None:
    namespace = k8s_namespace
    pods_path = f"/api/v1/namespaces/{namespace}/pods"
    for name in ("keep", "remove"):
        await asyncio.to_thread(create, admin, pods_path, bare_pod(name))
    port = await asyncio.to_thread(
        watcher_port, watcher_kubeconfig, namespace, backoff_max_seconds=1.0
    )
    try:
        recorder = Recorder(port)
        await port.list_nodes()
        await port.list_pods()
        async with recorder.watching():
            await asyncio.to_thread(create, admin, pods_path, bare_pod("before"))
            await eventually(lambda: ("added", "before") in recorder.pods(), "pod 'before'")
        # Not watching: these changes exist only in the apiserver now.
        await asyncio.to_thread(create, admin, pods_path, bare_pod("during"))
        await asyncio.to_thread(
            admin.json, "DELETE", f"{pods_path}/remove", body={"gracePeriodSeconds": 0}
        )
        await asyncio.to_thread(
            wait_until,
            lambda: "remove" not in {p["metadata"]["name"] for p in admin.get(pods_path)["items"]},
            what="pod 'remove' gone",
        )
        # The version the informer resumes from is compacted away, and the restarted
        # apiserver's watch cache starts after it: the resumed watch gets 410 Gone.
        await asyncio.to_thread(compact_etcd, k8s_cluster.etcd_url)
        await asyncio.to_thread(restart_apiserver, k8s_cluster.local)
        recorder.changes.clear()
        gone_before = counter(RELISTS, "pods", "gone")
        async with recorder.watching():
            await eventually(lambda: counter(RELISTS, "pods", "gone") > gone_before, "a relist")
            await eventually(
                lambda: (
                    ("deleted", "remove") in recorder.pods()
                    and ("added", "during") in recorder.pods()
                ),
                "the missed changes",
            )
            await asyncio.to_thread(create, admin, pods_path, bare_pod("after"))
            await eventually(lambda: ("added", "after") in recorder.pods(), "pod 'after'")
        changes = recorder.pods()
        # The missed changes once each; nothing for pods that did not change.
        assert changes.count(("added", "during")) == 1
        assert changes.count(("deleted", "remove")) == 1
        assert ("added", "keep") not in changes and ("added", "before") not in changes
        cached = {pod.name for pod in await port.list_pods()}
        assert {"keep", "before", "during", "after"} <= cached and "remove" not in cached
    finally:
        await port.close()


def restart_apiserver(local: Any) -> None:
    """Stop and start the session's kube-apiserver on the same port (etcd keeps the state)."""
    process = local._popens["kube-apiserver"]
    # Killed rather than terminated: a graceful stop waits out open watches for a minute.
    process.kill()
    process.wait(timeout=30)
    local._records[:] = [r for r in local._records if r.name != "kube-apiserver"]
    local._spawn("kube-apiserver", local._apiserver_args())
    local._wait_ready(
        "kube-apiserver", f"{local.server_url}/readyz", time.monotonic() + 120, tls="admin"
    )


async def test_an_apiserver_restart_mid_watch_is_survived(
    k8s_cluster: Any, admin: KubeHttp, k8s_namespace: str, watcher_kubeconfig: Path
) -> None:
    namespace = k8s_namespace
    pods_path = f"/api/v1/namespaces/{namespace}/pods"
    port = await asyncio.to_thread(
        watcher_port, watcher_kubeconfig, namespace, backoff_max_seconds=1.0
    )
    try:
        recorder = Recorder(port)
        await port.list_pods()
        async with recorder.watching():
            await asyncio.to_thread(create, admin, pods_path, bare_pod("first"))
            await eventually(lambda: ("added", "first") in recorder.pods(), "pod 'first'")
            errors_before = counter(WATCH_ERRORS, "pods")
            await asyncio.to_thread(restart_apiserver, k8s_cluster.local)
            await asyncio.to_thread(create, admin, pods_path, bare_pod("second"))
            await eventually(lambda: ("added", "second") in recorder.pods(), "pod 'second'")
            assert counter(WATCH_ERRORS, "pods") > errors_before  # it really lost the stream
        assert recorder.pods().count(("added", "first")) == 1
    finally:
        await port.close()


async def test_the_watcher_role_cannot_read_secrets(
    admin: KubeHttp, k8s_namespace: str, watcher_kubeconfig: Path
) -> None:
    port = await asyncio.to_thread(watcher_port, watcher_kubeconfig, k8s_namespace)
    try:
        assert await port.list_nodes()  # allowed
        for path in (
            f"/api/v1/namespaces/{k8s_namespace}/secrets",
            f"/api/v1/namespaces/{k8s_namespace}/configmaps",
            # It lists labelled scale targets, but nothing else of apps/v1.
            f"/apis/apps/v1/namespaces/{k8s_namespace}/daemonsets",
        ):
            with pytest.raises(ApiException) as denied:
                await asyncio.to_thread(port.http.get, path)
            assert denied.value.status == 403, path
        with pytest.raises(ApiException) as denied:
            await asyncio.to_thread(
                port.http.json,
                "POST",
                f"/api/v1/namespaces/{k8s_namespace}/pods",
                body=bare_pod(f"x-{uuid.uuid4().hex[:4]}"),
            )
        assert denied.value.status == 403
    finally:
        await port.close()


async def test_periodic_resync_relists_without_publishing_unchanged_objects(
    admin: KubeHttp, k8s_namespace: str, watcher_kubeconfig: Path
) -> None:
    pods_path = f"/api/v1/namespaces/{k8s_namespace}/pods"
    await asyncio.to_thread(create, admin, pods_path, bare_pod("steady"))
    port = await asyncio.to_thread(
        watcher_port, watcher_kubeconfig, k8s_namespace, resync_seconds=1.0
    )
    try:
        await port.list_nodes()
        await port.list_pods()
        recorder = Recorder(port)
        resyncs_before = counter(RELISTS, "pods", "resync")
        async with recorder.watching():
            await eventually(
                lambda: counter(RELISTS, "pods", "resync") >= resyncs_before + 2, "two resyncs"
            )
            await asyncio.to_thread(create, admin, pods_path, bare_pod("new"))
            await eventually(lambda: ("added", "new") in recorder.pods(), "pod 'new'")
        assert ("added", "steady") not in recorder.pods()
        assert recorder.pods().count(("added", "new")) == 1
    finally:
        await port.close()


async def test_a_late_add_older_than_the_deletion_does_not_bring_a_pod_back(
    admin: KubeHttp, k8s_namespace: str, watcher_kubeconfig: Path, bus: Bus, unique: str
) -> None:
    """The apiserver's resourceVersions order the pod's states: its deletion wins over a
    replay of its older add (a stale relist, a second watcher), whatever the clocks say."""
    pods_path = f"/api/v1/namespaces/{k8s_namespace}/pods"
    port = await asyncio.to_thread(watcher_port, watcher_kubeconfig, k8s_namespace)
    watcher = Watcher(port, bus, bucket=f"snap_{unique}")
    events: list[Any] = []
    ready = asyncio.Event()
    try:
        async with (
            running(
                collect(
                    bus.subscribe(POD_CHANGED.filter(namespace=k8s_namespace), consumer="t"),
                    events,
                )
            ),
            running(watcher.run(ready)),
        ):
            await asyncio.wait_for(ready.wait(), WAIT)
            await asyncio.to_thread(create, admin, pods_path, bare_pod("brief"))
            seen = await eventually(
                lambda: [p for p in port.pods.cache.values() if p.name == "brief"], "the pod"
            )
            as_added = seen[0]
            await asyncio.to_thread(
                admin.json, "DELETE", f"{pods_path}/brief", body={"gracePeriodSeconds": 0}
            )
            await eventually(
                lambda: any(e.data.change == "deleted" for e in events), "the pod's deletion"
            )
            stale_before = counter(STALE, "pod")
            await watcher.handle(ClusterChange("added", as_added))
            await watcher.handle(ClusterChange("modified", as_added))
            assert counter(STALE, "pod") == stale_before + 2
            await watcher.flushed()
            assert watcher.snapshot is not None
            assert await watcher.snapshot.get(pod_key(k8s_namespace, "brief"), PodChanged) is None
            # Recreated under the same name: a later version, taken as a new pod.
            await asyncio.to_thread(create, admin, pods_path, bare_pod("brief"))
            await eventually(
                lambda: [e for e in events if e.data.change == "added"][1:], "the new pod"
            )
        changes = [e.data.change for e in events if e.data.name == "brief"]
        assert changes.count("deleted") == 1 and changes[-1] in {"added", "modified"}
        assert changes.index("deleted") < len(changes) - 1
    finally:
        await port.close()


async def test_a_watcher_that_falls_behind_holds_back_the_informers_and_loses_nothing(
    admin: KubeHttp,
    k8s_namespace: str,
    watcher_kubeconfig: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Two changes may wait for the watcher; the informer thread waits for room past that.
    monkeypatch.setattr(kubernetes, "WATCH_BUFFER", 2)
    pods_path = f"/api/v1/namespaces/{k8s_namespace}/pods"
    port = await asyncio.to_thread(watcher_port, watcher_kubeconfig, k8s_namespace)
    names = [f"burst-{index}" for index in range(12)]
    taken: list[tuple[str, str]] = []
    go = asyncio.Event()

    def added() -> list[str]:
        return [name for change, name in taken if change == "added"]

    async def slow_watcher() -> None:
        async for change in port.watch():
            if isinstance(change.obj, Pod):
                taken.append((change.type, change.obj.name))
            await go.wait()  # stalled until the burst is in the apiserver

    try:
        await port.list_nodes()
        await port.list_pods()
        async with running(slow_watcher()):
            for name in names:
                await asyncio.to_thread(create, admin, pods_path, bare_pod(name))
            assert len(taken) <= 1  # the stalled watcher took one change, no more
            go.set()
            await eventually(lambda: len(added()) >= len(names), "the whole burst")
        assert added() == names  # in order, each once (kwok's status updates come between)
    finally:
        await port.close()
