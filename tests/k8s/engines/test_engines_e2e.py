"""The real engines on the local control plane: their controllers create the pods (kwok plays
them on its fake nodes) and follow the replicas asked for; Kueue admits by quota through its
webhooks and controllers."""

from __future__ import annotations

from typing import Any

import pytest

from tests.k8s.engines.engine_objects import (
    JOBS,
    PYTORCHJOBS,
    RAYCLUSTERS,
    WORKLOADS,
    batch_job,
    condition,
    elastic_pytorch_job,
    eventually,
    kueue_queues,
    merge_patch,
    pods,
    ray_cluster,
    running_count,
    running_on_kwok,
)
from tideshift.services.cluster.adapters.http import KubeHttp

pytestmark = pytest.mark.k8s

# A loaded two-core machine: a controller must follow within this many seconds.
FOLLOW_S = 120.0


def test_training_operator_creates_and_resizes_an_elastic_pytorchjob(
    engine_admin: KubeHttp, engine_namespace: str
) -> None:
    http, ns = engine_admin, engine_namespace
    jobs = PYTORCHJOBS.format(ns=ns)
    http.json("POST", jobs, body=elastic_pytorch_job("elastic", workers=2, low=1, high=4))
    selector = "training.kubeflow.org/job-name=elastic"

    for replicas in (2, 4, 1):
        merge_patch(
            http,
            f"{jobs}/elastic",
            {"spec": {"pytorchReplicaSpecs": {"Worker": {"replicas": replicas}}}},
        )

        def followed(n: int = replicas) -> bool:
            return len(pods(http, ns, selector)) == n and running_count(http, ns, selector) == n

        eventually(
            followed,
            timeout=FOLLOW_S,
            what=f"the training operator to run {replicas} worker pods on kwok nodes",
        )
    # The operator's own pods: owned by the job, with its replica labels.
    pod = pods(http, ns, selector)[0]
    assert pod["metadata"]["ownerReferences"][0]["kind"] == "PyTorchJob"
    assert pod["metadata"]["labels"]["training.kubeflow.org/replica-type"] == "worker"


def _set_ray_workers(
    http: KubeHttp, path: str, replicas: int, workers_to_delete: list[str] | None = None
) -> None:
    """Read, change, replace: a merge patch would replace the whole worker group list."""
    cluster: dict[str, Any] = http.get(path)
    group = cluster["spec"]["workerGroupSpecs"][0]
    group["replicas"] = replicas
    if workers_to_delete is not None:
        group["scaleStrategy"] = {"workersToDelete": workers_to_delete}
    http.json("PUT", path, body=cluster)


def test_kuberay_creates_and_resizes_a_worker_group(
    engine_admin: KubeHttp, engine_namespace: str
) -> None:
    http, ns = engine_admin, engine_namespace
    path = f"{RAYCLUSTERS.format(ns=ns)}/ray"
    http.json("POST", RAYCLUSTERS.format(ns=ns), body=ray_cluster("ray", workers=2, low=1, high=5))
    workers = "ray.io/cluster=ray,ray.io/node-type=worker"
    head = "ray.io/cluster=ray,ray.io/node-type=head"
    eventually(
        lambda: running_count(http, ns, head) == 1 and running_count(http, ns, workers) == 2,
        timeout=FOLLOW_S,
        what="KubeRay to run the head and 2 workers on kwok nodes",
    )

    _set_ray_workers(http, path, 4)
    eventually(
        lambda: len(pods(http, ns, workers)) == 4 and running_count(http, ns, workers) == 4,
        timeout=FOLLOW_S,
        what="KubeRay to grow the worker group to 4",
    )

    # Shrinking, Tideshift can name which workers go (KubeRay's scaleStrategy).
    chosen = sorted(pod["metadata"]["name"] for pod in pods(http, ns, workers))[0]
    _set_ray_workers(http, path, 3, workers_to_delete=[chosen])
    remaining = eventually(
        lambda: (
            (names := {pod["metadata"]["name"] for pod in pods(http, ns, workers)})
            and len(names) == 3
            and names
        ),
        timeout=FOLLOW_S,
        what=f"KubeRay to shrink the worker group to 3 by deleting {chosen}",
    )
    assert chosen not in remaining
    assert all(running_on_kwok(pod) for pod in pods(http, ns, workers))


def _workload_of(http: KubeHttp, ns: str, job: str) -> dict[str, Any] | None:
    items = http.get(WORKLOADS.format(ns=ns))["items"]
    for workload in items:
        owners = workload["metadata"].get("ownerReferences", [])
        if any(owner["kind"] == "Job" and owner["name"] == job for owner in owners):
            return dict(workload)
    return None


def test_kueue_admits_a_queued_job_by_quota_and_holds_the_next(
    engine_admin: KubeHttp, engine_namespace: str
) -> None:
    http, ns = engine_admin, engine_namespace
    jobs = JOBS.format(ns=ns)
    _, local_queue = kueue_queues(http, ns, name=f"cq-{ns}"[:60], cpu="2")

    # Within quota (2 x 500m of 2 CPUs): admitted, unsuspended, its pods run.
    http.json(
        "POST",
        jobs,
        body=batch_job("fits", queue=local_queue, parallelism=2, cpu="500m", suspend=True),
    )
    admitted = eventually(
        lambda: (w := _workload_of(http, ns, "fits")) and condition(w, "Admitted") == "True" and w,
        timeout=FOLLOW_S,
        what="Kueue to admit the workload of job fits",
    )
    assert admitted["status"]["admission"]["clusterQueue"].startswith("cq-")
    eventually(
        lambda: (
            http.get(f"{jobs}/fits")["spec"]["suspend"] is False
            and running_count(http, ns, "app=fits") == 2
        ),
        timeout=FOLLOW_S,
        what="job fits to be unsuspended and its 2 pods to run on kwok nodes",
    )

    # Over what is left (2 x 1 CPU of 1): Kueue's webhook suspends it on creation, and its
    # workload waits without quota, so no pod is created.
    created = http.json(
        "POST",
        jobs,
        body=batch_job("waits", queue=local_queue, parallelism=2, cpu="1", suspend=None),
    )
    assert created["spec"]["suspend"] is True, "Kueue's mutating webhook did not suspend it"
    pending = eventually(
        lambda: (w := _workload_of(http, ns, "waits")) and condition(w, "QuotaReserved") and w,
        timeout=FOLLOW_S,
        what="Kueue to evaluate the workload of job waits",
    )
    assert condition(pending, "QuotaReserved") == "False"
    assert condition(pending, "Admitted") != "True"
    assert pods(http, ns, "app=waits") == []

    # The first job leaves: its quota goes to the one waiting.
    http.json("DELETE", f"{jobs}/fits", query=[("propagationPolicy", "Background")])
    eventually(
        lambda: (
            http.get(f"{jobs}/waits")["spec"]["suspend"] is False
            and running_count(http, ns, "app=waits") == 2
        ),
        timeout=FOLLOW_S,
        what="Kueue to admit job waits once fits is gone, and its pods to run",
    )
