"""Objects the engine tests create, and how they read what the engines did."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest

from tests.k8s.cluster_objects import pytorch_job
from tideshift.services.cluster.adapters.http import MERGE_PATCH, KubeHttp

PYTORCHJOBS = "/apis/kubeflow.org/v1/namespaces/{ns}/pytorchjobs"
RAYCLUSTERS = "/apis/ray.io/v1/namespaces/{ns}/rayclusters"
JOBS = "/apis/batch/v1/namespaces/{ns}/jobs"
WORKLOADS = "/apis/kueue.x-k8s.io/v1beta2/namespaces/{ns}/workloads"
LOCALQUEUES = "/apis/kueue.x-k8s.io/v1beta2/namespaces/{ns}/localqueues"
CLUSTERQUEUES = "/apis/kueue.x-k8s.io/v1beta2/clusterqueues"
RESOURCEFLAVORS = "/apis/kueue.x-k8s.io/v1beta2/resourceflavors"
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"


def eventually(
    check: Callable[[], Any], *, timeout: float, what: str, interval: float = 0.5
) -> Any:
    """Polls `check` until it returns something truthy, which is returned; else fails naming
    `what` and the last value seen."""
    deadline = time.monotonic() + timeout
    while True:
        last = check()
        if last:
            return last
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout:.0f}s waiting for {what}; last seen: {last!r}")
        time.sleep(interval)


def pods(http: KubeHttp, namespace: str, selector: str) -> list[dict[str, Any]]:
    """Live pods matching the label selector (those being deleted left out)."""
    items = http.get(f"/api/v1/namespaces/{namespace}/pods", query=[("labelSelector", selector)])
    return [pod for pod in items["items"] if not pod["metadata"].get("deletionTimestamp")]


def running_on_kwok(pod: dict[str, Any]) -> bool:
    node = pod["spec"].get("nodeName") or ""
    return pod["status"].get("phase") == "Running" and node.startswith("kwok-")


def running_count(http: KubeHttp, namespace: str, selector: str) -> int:
    return sum(running_on_kwok(pod) for pod in pods(http, namespace, selector))


def merge_patch(http: KubeHttp, path: str, patch: dict[str, Any]) -> dict[str, Any]:
    return http.json("PATCH", path, body=patch, content_type=MERGE_PATCH)


def container(name: str, cpu: str = "100m") -> dict[str, Any]:
    return {
        "name": name,
        "image": "example.invalid/fake:1",
        "resources": {"requests": {"cpu": cpu, "memory": "64Mi"}},
    }


def elastic_pytorch_job(name: str, *, workers: int, low: int, high: int) -> dict[str, Any]:
    """cluster_objects.pytorch_job as the training operator's webhook accepts it: its container
    named `pytorch`, with an image."""
    job = pytorch_job(name, workers=workers, low=low, high=high)
    job["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]["containers"] = [
        container("pytorch")
    ]
    return job


def ray_cluster(name: str, *, workers: int, low: int, high: int) -> dict[str, Any]:
    def template(container_name: str) -> dict[str, Any]:
        return {
            "spec": {
                "containers": [container(container_name)],
                "terminationGracePeriodSeconds": 0,
            }
        }

    return {
        "apiVersion": "ray.io/v1",
        "kind": "RayCluster",
        "metadata": {"name": name},
        "spec": {
            "rayVersion": "2.46.0",
            "headGroupSpec": {"rayStartParams": {}, "template": template("ray-head")},
            "workerGroupSpecs": [
                {
                    "groupName": "workers",
                    "replicas": workers,
                    "minReplicas": low,
                    "maxReplicas": high,
                    "rayStartParams": {},
                    "template": template("ray-worker"),
                }
            ],
        },
    }


def batch_job(
    name: str, *, queue: str, parallelism: int, cpu: str, suspend: bool | None
) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "parallelism": parallelism,
        "completions": parallelism,
        "template": {
            "metadata": {"labels": {"app": name}},
            "spec": {
                "containers": [container("main", cpu)],
                "restartPolicy": "Never",
                "terminationGracePeriodSeconds": 0,
            },
        },
    }
    if suspend is not None:
        spec["suspend"] = suspend
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name, "labels": {QUEUE_LABEL: queue}},
        "spec": spec,
    }


def kueue_queues(http: KubeHttp, namespace: str, *, name: str, cpu: str) -> tuple[str, str]:
    """A ResourceFlavor, a ClusterQueue with `cpu` of nominal quota for every namespace, and a
    LocalQueue in `namespace`; returns (cluster queue, local queue)."""
    flavor = f"{name}-flavor"
    http.json("POST", RESOURCEFLAVORS, body={"apiVersion": "kueue.x-k8s.io/v1beta2",
                                             "kind": "ResourceFlavor",
                                             "metadata": {"name": flavor}})  # fmt: skip
    cluster_queue = {
        "apiVersion": "kueue.x-k8s.io/v1beta2",
        "kind": "ClusterQueue",
        "metadata": {"name": name},
        "spec": {
            "namespaceSelector": {},
            "resourceGroups": [
                {
                    "coveredResources": ["cpu", "memory"],
                    "flavors": [
                        {
                            "name": flavor,
                            "resources": [
                                {"name": "cpu", "nominalQuota": cpu},
                                {"name": "memory", "nominalQuota": "64Gi"},
                            ],
                        }
                    ],
                }
            ],
        },
    }
    http.json("POST", CLUSTERQUEUES, body=cluster_queue)
    local_queue = {
        "apiVersion": "kueue.x-k8s.io/v1beta2",
        "kind": "LocalQueue",
        "metadata": {"name": f"{name}-local"},
        "spec": {"clusterQueue": name},
    }
    http.json("POST", LOCALQUEUES.format(ns=namespace), body=local_queue)
    return name, f"{name}-local"


def condition(obj: dict[str, Any], kind: str) -> str | None:
    for item in obj.get("status", {}).get("conditions", []):
        if item.get("type") == kind:
            return str(item.get("status"))
    return None
