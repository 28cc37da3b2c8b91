"""The local control plane is a real Kubernetes: versions, controllers, the scheduler, etcd
semantics (409, 410) and RBAC all behave as in a production cluster."""

from __future__ import annotations

import json
import subprocess
import urllib.request
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client, config

from tideshift.services.devcluster.nodes import KWOK_NODE_ANNOTATION, NodeSpec
from tideshift.services.devcluster.processes import wait_for
from tideshift.services.devcluster.versions import HELM_VERSION, K8S_VERSION

pytestmark = pytest.mark.k8s

WAIT = 60.0


@pytest.fixture
def api(k8s_cluster: Any) -> Any:
    with k8s_cluster.api_client() as api_client:
        yield api_client


def _pod(
    name: str, *, cpu: str, labels: dict[str, str] | None = None, **spec: Any
) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": labels or {}},
        "spec": {
            "containers": [
                {"name": "main", "image": "fake", "resources": {"requests": {"cpu": cpu}}}
            ],
            "terminationGracePeriodSeconds": 0,
            **spec,
        },
    }


def _read_or_none(read: Callable[[], Any]) -> Any:
    try:
        return read()
    except client.ApiException as error:
        if error.status == 404:
            return None
        raise


def test_fixture_start_up_is_measured_and_every_node_is_ready(k8s_cluster: Any, api: Any) -> None:
    print(f"\nk8s fixture start-up: {k8s_cluster.startup_seconds:.1f}s")
    nodes = client.CoreV1Api(api).list_node().items
    by_name = {node.metadata.name: node for node in nodes}
    for spec in k8s_cluster.nodes:
        node = by_name[spec.name]
        assert node.metadata.annotations[KWOK_NODE_ANNOTATION] == "fake"
        assert node.status.allocatable["cpu"] == spec.cpu
        if spec.gpus:
            assert node.status.allocatable["nvidia.com/gpu"] == str(spec.gpus)
        ready = {c.type: c.status for c in node.status.conditions}["Ready"]
        assert ready == "True", spec.name
    assert k8s_cluster.startup_seconds > 0


def test_version_endpoint_reports_the_pinned_release(api: Any) -> None:
    info = client.VersionApi(api).get_code()
    assert info.git_version == K8S_VERSION
    assert (info.major, info.minor) == ("1", K8S_VERSION.split(".")[1])


def test_bundled_kubectl_and_helm_run_against_the_cluster(k8s_cluster: Any) -> None:
    kubectl = subprocess.run(
        [
            str(k8s_cluster.bin_dir / "kubectl"),
            f"--kubeconfig={k8s_cluster.kubeconfig}",
            *("get", "nodes", "-o", "name"),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert "node/kwok-node-0" in kubectl.stdout.split()
    helm = subprocess.run(
        [str(k8s_cluster.bin_dir / "helm"), "version", "--short"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert helm.stdout.startswith(HELM_VERSION)


def test_scale_subresource_yields_running_pods_on_kwok_nodes(
    k8s_cluster: Any, api: Any, k8s_namespace: str
) -> None:
    apps = client.AppsV1Api(api)
    core = client.CoreV1Api(api)
    labels = {"app": "web"}
    apps.create_namespaced_deployment(
        k8s_namespace,
        {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {"name": "web"},
            "spec": {
                "replicas": 0,
                "selector": {"matchLabels": labels},
                "template": {
                    "metadata": {"labels": labels},
                    "spec": _pod("ignored", cpu="100m")["spec"],
                },
            },
        },
    )

    apps.patch_namespaced_deployment_scale("web", k8s_namespace, {"spec": {"replicas": 3}})

    assert apps.read_namespaced_deployment_scale("web", k8s_namespace).spec.replicas == 3
    kwok_nodes = {spec.name for spec in k8s_cluster.nodes}

    def running_pods_on_kwok() -> int:
        pods = core.list_namespaced_pod(k8s_namespace, label_selector="app=web").items
        return sum(
            1
            for pod in pods
            if pod.status.phase == "Running"
            and pod.spec.node_name in kwok_nodes
            and pod.metadata.deletion_timestamp is None
        )

    wait_for(lambda: running_pods_on_kwok() == 3, timeout=WAIT, what="3 Running web pods")
    wait_for(
        lambda: apps.read_namespaced_deployment("web", k8s_namespace).status.ready_replicas == 3,
        timeout=WAIT,
        what="Deployment web to report 3 ready replicas",
    )


def test_high_priority_pod_preempts_low_priority_pod_on_a_full_node(
    k8s_cluster: Any, api: Any, k8s_namespace: str
) -> None:
    core = client.CoreV1Api(api)
    scheduling = client.SchedulingV1Api(api)
    suffix = uuid.uuid4().hex[:6]
    node = f"preempt-{suffix}"
    low_class, high_class = f"low-{suffix}", f"high-{suffix}"
    # A private one-cpu node that only these pods tolerate, so the other tests' pods and
    # nodes cannot absorb either pod.
    taint = {"key": "tideshift.io/test-node", "value": node, "effect": "NoSchedule"}
    k8s_cluster.create_nodes(
        [
            NodeSpec(
                node, cpu="1", memory="4Gi", labels={"tideshift.io/test-node": node}, taints=[taint]
            )
        ]
    )
    placement = {
        "nodeSelector": {"tideshift.io/test-node": node},
        "tolerations": [{"key": "tideshift.io/test-node", "operator": "Equal", "value": node}],
    }
    try:
        for name, value in ((low_class, 100), (high_class, 1_000_000)):
            scheduling.create_priority_class(
                {
                    "metadata": {"name": name},
                    "value": value,
                    "preemptionPolicy": "PreemptLowerPriority",
                }
            )
        core.create_namespaced_pod(
            k8s_namespace, _pod("low", cpu="800m", priorityClassName=low_class, **placement)
        )
        wait_for(
            lambda: core.read_namespaced_pod("low", k8s_namespace).status.phase == "Running",
            timeout=WAIT,
            what="the low-priority pod to run",
        )

        high = core.create_namespaced_pod(
            k8s_namespace, _pod("high", cpu="800m", priorityClassName=high_class, **placement)
        )

        # The Priority admission plugin resolved the class into the pod's priority.
        assert high.spec.priority == 1_000_000
        wait_for(
            lambda: _read_or_none(lambda: core.read_namespaced_pod("low", k8s_namespace)) is None,
            timeout=WAIT,
            what="the scheduler to preempt the low-priority pod",
        )
        wait_for(
            lambda: (
                (pod := core.read_namespaced_pod("high", k8s_namespace)).spec.node_name == node
                and pod.status.phase == "Running"
            ),
            timeout=WAIT,
            what="the high-priority pod to run on the full node",
        )
    finally:
        for name in (low_class, high_class):
            _read_or_none(lambda name=name: scheduling.delete_priority_class(name))
        k8s_cluster.delete_nodes([node])


def test_update_with_stale_resource_version_is_a_conflict(api: Any, k8s_namespace: str) -> None:
    core = client.CoreV1Api(api)
    created = core.create_namespaced_config_map(
        k8s_namespace, {"metadata": {"name": "settings"}, "data": {"replicas": "1"}}
    )
    stale_version = created.metadata.resource_version
    core.replace_namespaced_config_map(
        "settings",
        k8s_namespace,
        {
            "metadata": {"name": "settings", "resourceVersion": stale_version},
            "data": {"replicas": "2"},
        },
    )

    with pytest.raises(client.ApiException) as raised:
        core.replace_namespaced_config_map(
            "settings",
            k8s_namespace,
            {
                "metadata": {"name": "settings", "resourceVersion": stale_version},
                "data": {"replicas": "3"},
            },
        )

    assert raised.value.status == 409
    assert json.loads(raised.value.body)["reason"] == "Conflict"
    assert core.read_namespaced_config_map("settings", k8s_namespace).data == {"replicas": "2"}


def _etcd_post(etcd_url: str, path: str, body: dict[str, Any]) -> dict[str, Any]:
    request = urllib.request.Request(
        f"{etcd_url}{path}",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
        method="POST",
    )
    with urllib.request.urlopen(request, timeout=10) as response:
        answer: dict[str, Any] = json.loads(response.read())
    return answer


def test_watch_resumed_from_a_compacted_revision_is_gone(
    k8s_cluster: Any, api: Any, k8s_namespace: str
) -> None:
    # Core Events bypass the apiserver's watch cache by default (its DefaultWatchCacheSizes
    # sets them to 0), so this watch is served by etcd and sees etcd's compaction directly.
    core = client.CoreV1Api(api)
    event = {
        "metadata": {"name": "probe"},
        "involvedObject": {
            "kind": "ConfigMap",
            "name": "anything",
            "namespace": k8s_namespace,
            "apiVersion": "v1",
        },
        "reason": "Probe",
        "message": "first",
        "type": "Normal",
    }
    first_version = core.create_namespaced_event(k8s_namespace, event).metadata.resource_version
    for message in ("second", "third"):
        latest = core.patch_namespaced_event("probe", k8s_namespace, {"message": message})
    # resourceVersion is the etcd revision: compact everything up to the latest write.
    compacted = _etcd_post(
        k8s_cluster.etcd_url,
        "/v3/kv/compaction",
        {"revision": latest.metadata.resource_version, "physical": True},
    )
    assert "error" not in compacted

    status, answer = _first_watch_answer(api, k8s_namespace, first_version)

    if status == 410:
        assert answer["code"] == 410
    else:
        assert answer["type"] == "ERROR"
        assert answer["object"]["code"] == 410
        assert answer["object"]["reason"] in {"Expired", "Gone"}
    # The documented recovery works: list for a fresh version, watch from there.
    fresh = core.list_namespaced_event(k8s_namespace).metadata.resource_version
    status, answer = _first_watch_answer(api, k8s_namespace, fresh, field="metadata.name=probe")
    assert status == 200
    assert answer["type"] != "ERROR"


def _first_watch_answer(
    api: Any, namespace: str, resource_version: str, field: str | None = None
) -> tuple[int, dict[str, Any]]:
    """(HTTP status, first watch event or error body) of a watch from resource_version."""
    core = client.CoreV1Api(api)
    try:
        response = core.list_namespaced_event(
            namespace,
            watch=True,
            resource_version=resource_version,
            field_selector=field,
            allow_watch_bookmarks=False,
            timeout_seconds=5,
            _preload_content=False,
        )
    except client.ApiException as error:
        return error.status, json.loads(error.body)
    try:
        for line in response.stream(decode_content=True):
            return response.status, json.loads(line.splitlines()[0])
        # A watch with nothing to report after timeout_seconds: an empty, healthy stream.
        return response.status, {"type": "TIMEOUT"}
    finally:
        response.release_conn()


def test_rbac_denies_a_service_account_without_rights(
    api: Any,
    k8s_namespace: str,
    k8s_service_account_kubeconfig: Callable[[str, str], Path],
) -> None:
    rbac = client.RbacAuthorizationV1Api(api)
    rbac.create_namespaced_role(
        k8s_namespace,
        {
            "metadata": {"name": "pod-reader"},
            "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list"]}],
        },
    )
    rbac.create_namespaced_role_binding(
        k8s_namespace,
        {
            "metadata": {"name": "reader-reads-pods"},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "Role",
                "name": "pod-reader",
            },
            "subjects": [{"kind": "ServiceAccount", "name": "reader", "namespace": k8s_namespace}],
        },
    )
    nobody = config.new_client_from_config(
        config_file=str(k8s_service_account_kubeconfig(k8s_namespace, "nobody"))
    )
    reader = config.new_client_from_config(
        config_file=str(k8s_service_account_kubeconfig(k8s_namespace, "reader"))
    )
    with nobody, reader:
        with pytest.raises(client.ApiException) as denied:
            client.CoreV1Api(nobody).list_namespaced_pod(k8s_namespace)
        assert denied.value.status == 403
        assert (
            f"system:serviceaccount:{k8s_namespace}:nobody"
            in json.loads(denied.value.body)["message"]
        )

        # The same request as an account with a matching RoleBinding succeeds (the authorizer
        # sees new bindings through an informer, hence the wait) but stays confined to pods.
        def reader_may_list_pods() -> bool:
            try:
                client.CoreV1Api(reader).list_namespaced_pod(k8s_namespace)
            except client.ApiException as error:
                if error.status == 403:
                    return False
                raise
            return True

        wait_for(reader_may_list_pods, timeout=30, what="the RoleBinding to take effect")
        with pytest.raises(client.ApiException) as secrets_denied:
            client.CoreV1Api(reader).list_namespaced_secret(k8s_namespace)
        assert secrets_denied.value.status == 403


def test_state_survives_an_apiserver_crash_and_restart(
    k8s_cluster: Any, api: Any, k8s_namespace: str
) -> None:
    core = client.CoreV1Api(api)
    before = core.create_namespaced_config_map(
        k8s_namespace, {"metadata": {"name": "kept"}, "data": {"k": "v"}}
    )
    old_pid = next(p.pid for p in k8s_cluster.local.processes if p.name == "kube-apiserver")

    k8s_cluster.local.restart("kube-apiserver")

    new_pid = next(p.pid for p in k8s_cluster.local.processes if p.name == "kube-apiserver")
    assert new_pid != old_pid
    after = core.read_namespaced_config_map("kept", k8s_namespace)
    assert after.metadata.uid == before.metadata.uid
    assert after.data == {"k": "v"}
