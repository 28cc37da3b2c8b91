"""Manifests and small helpers shared by the watcher/executor tests and benchmarks.

The Volcano and PyTorchJob CRDs are minimal structural schemas with the upstream group,
version and kind, declaring only the fields Tideshift reads and writes (everything else is
preserved as unknown fields), so the real apiserver validates and versions them as it would
the real ones.
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import yaml
from kubernetes.client.exceptions import ApiException

from tideshift.events import WorkloadRef
from tideshift.services.cluster.adapters.http import MERGE_PATCH, KubeHttp
from tideshift.services.devcluster.crds import WORKLOAD_CRDS

RBAC_MANIFEST = Path(__file__).resolve().parents[2] / "charts" / "tideshift" / "files" / "rbac.yaml"


def wait_until(check: Callable[[], Any], *, timeout: float = 60.0, what: str = "condition") -> Any:
    """Poll `check` until it returns something truthy (which is returned)."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(0.05)


def create(http: KubeHttp, path: str, obj: dict[str, Any]) -> dict[str, Any]:
    """POST to the collection at `path`; an existing object is returned as it is."""
    try:
        return http.json("POST", path, body=obj)
    except ApiException as error:
        if error.status != 409:
            raise
        return http.get(f"{path}/{obj['metadata']['name']}")


def install_crds(http: KubeHttp) -> None:
    for crd in WORKLOAD_CRDS:
        create(http, "/apis/apiextensions.k8s.io/v1/customresourcedefinitions", crd)

    def established(name: str) -> bool:
        crd = http.get(f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{name}")
        conditions = (crd.get("status") or {}).get("conditions") or []
        return any(c["type"] == "Established" and c["status"] == "True" for c in conditions)

    for crd in WORKLOAD_CRDS:
        wait_until(lambda n=crd["metadata"]["name"]: established(n), what="CRD established")

    def served() -> bool:
        try:
            http.get("/apis/batch.volcano.sh/v1alpha1")
            http.get("/apis/kubeflow.org/v1")
        except ApiException:
            return False
        return True

    wait_until(served, what="CRD groups served")


def apply_rbac(http: KubeHttp) -> list[str]:
    """Create or replace the ClusterRoles of the RBAC manifest; their names."""
    names = []
    for doc in yaml.safe_load_all(RBAC_MANIFEST.read_text()):
        if not doc:
            continue
        assert doc["kind"] == "ClusterRole", "the RBAC manifest holds ClusterRoles only"
        path = "/apis/rbac.authorization.k8s.io/v1/clusterroles"
        name = doc["metadata"]["name"]
        try:
            http.json("POST", path, body=doc)
        except ApiException as error:
            if error.status != 409:
                raise
            http.json(
                "PATCH", f"{path}/{name}", body={"rules": doc["rules"]}, content_type=MERGE_PATCH
            )
        names.append(name)
    return names


def bind_cluster_role(http: KubeHttp, role: str, namespace: str, service_account: str) -> None:
    create(
        http,
        "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings",
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRoleBinding",
            "metadata": {"name": f"{role}-{namespace}-{service_account}"},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "ClusterRole",
                "name": role,
            },
            "subjects": [
                {"kind": "ServiceAccount", "name": service_account, "namespace": namespace}
            ],
        },
    )


def pod_template(labels: dict[str, str], *, cpu: str = "100m") -> dict[str, Any]:
    return {
        "metadata": {"labels": labels},
        "spec": {
            "containers": [
                {"name": "main", "image": "fake", "resources": {"requests": {"cpu": cpu}}}
            ],
            "terminationGracePeriodSeconds": 0,
        },
    }


def deployment(
    name: str,
    replicas: int,
    *,
    role: str = "serving",
    cpu: str = "100m",
    annotations: dict[str, str] | None = None,
) -> dict[str, Any]:
    labels = {"app": name, "tideshift.io/role": role}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "annotations": annotations or {}},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": name}},
            "template": pod_template(labels, cpu=cpu),
        },
    }


def statefulset(name: str, replicas: int) -> dict[str, Any]:
    return {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": {"name": name},
        "spec": {
            "replicas": replicas,
            "serviceName": name,
            "selector": {"matchLabels": {"app": name}},
            "template": pod_template({"app": name}),
        },
    }


def batch_job(name: str, parallelism: int, *, annotations: dict[str, str] | None = None) -> Any:
    template = pod_template({"app": name})
    template["spec"]["restartPolicy"] = "Never"
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name, "annotations": annotations or {}},
        # Suspended: the test scales the spec; no pods need to run.
        "spec": {
            "parallelism": parallelism,
            "completions": 100,
            "suspend": True,
            "template": template,
        },
    }


def volcano_job(name: str, *, workers: int, min_available: int, ps: int = 1) -> dict[str, Any]:
    return {
        "apiVersion": "batch.volcano.sh/v1alpha1",
        "kind": "Job",
        "metadata": {"name": name},
        "spec": {
            "minAvailable": min_available,
            "schedulerName": "volcano",
            "tasks": [
                {"name": "ps", "replicas": ps, "template": pod_template({"role": "ps"})},
                {"name": "worker", "replicas": workers, "template": pod_template({"role": "w"})},
            ],
        },
    }


def pytorch_job(name: str, *, workers: int, low: int, high: int) -> dict[str, Any]:
    return {
        "apiVersion": "kubeflow.org/v1",
        "kind": "PyTorchJob",
        "metadata": {"name": name},
        "spec": {
            "elasticPolicy": {"minReplicas": low, "maxReplicas": high, "rdzvBackend": "c10d"},
            "pytorchReplicaSpecs": {
                "Worker": {
                    "replicas": workers,
                    "restartPolicy": "OnFailure",
                    "template": pod_template({"role": "worker"}),
                }
            },
        },
    }


COLLECTIONS = {
    "Deployment.apps": "/apis/apps/v1/namespaces/{ns}/deployments",
    "StatefulSet.apps": "/apis/apps/v1/namespaces/{ns}/statefulsets",
    "Job.batch": "/apis/batch/v1/namespaces/{ns}/jobs",
    "Job.batch.volcano.sh": "/apis/batch.volcano.sh/v1alpha1/namespaces/{ns}/jobs",
    "PyTorchJob.kubeflow.org": "/apis/kubeflow.org/v1/namespaces/{ns}/pytorchjobs",
}


def collection(kind: str, namespace: str) -> str:
    """The collection path of a kind, group-qualified or one of the well-known bare kinds."""
    return COLLECTIONS[WorkloadRef(namespace, kind, "any").kind].format(ns=namespace)


def service_kubeconfig(
    admin: KubeHttp,
    namespace: str,
    service: str,
    make_kubeconfig: Callable[[str, str], Path],
) -> Path:
    """A kubeconfig for ServiceAccount `service` bound to exactly its `tideshift-<service>` role
    (from the chart's RBAC manifest), with the elastic-job CRDs installed."""
    apply_rbac(admin)
    install_crds(admin)
    path = make_kubeconfig(namespace, service)
    bind_cluster_role(admin, f"tideshift-{service}", namespace, service)
    return path


def pipeline_kubeconfigs(
    admin: KubeHttp, k8s_cluster: Any, namespace: str, directory: Path
) -> dict[str, str]:
    """The watcher's and the executor's kubeconfigs (written in `directory`), each acting as
    its own ServiceAccount in `namespace` with exactly the chart's ClusterRole."""
    apply_rbac(admin)
    kubeconfig = {}
    for service in ("watcher", "executor"):
        path = directory / f"{service}.kubeconfig"
        kubeconfig[service] = str(k8s_cluster.service_account_kubeconfig(namespace, service, path))
        bind_cluster_role(admin, f"tideshift-{service}", namespace, service)
    return kubeconfig


def end_processes(processes: Sequence[subprocess.Popen[bytes]]) -> None:
    """TERM every process, then KILL any still running 15 s later: all asked at once, so
    one slow to leave does not hold back the others' shutdown."""
    for process in processes:
        process.terminate()
    for process in processes:
        try:
            process.wait(15)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
