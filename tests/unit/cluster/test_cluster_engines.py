"""The rules for targets another engine also drives (Kueue's hold, KubeRay's workers to
delete) and the RayCluster adapter's pure half."""

from __future__ import annotations

from typing import Any

import pytest

from tideshift.services.cluster.adapters.targets import RayClusterAdapter, default_adapters
from tideshift.services.cluster.core.conversions import workload_from_object
from tideshift.services.cluster.core.engines import (
    KUEUE_HOLD_PREFIX,
    KUEUE_QUEUE_LABEL,
    kueue_hold,
    workers_to_delete,
)
from tideshift.services.cluster.core.kinds import (
    API_VERSION,
    RAY_CLUSTER,
    normalise_kind,
    qualified_kind,
)
from tideshift.services.cluster.port import UnsupportedTarget, WorkloadRef


def job(*, queue: str | None, spec: dict[str, Any]) -> dict[str, Any]:
    labels = {KUEUE_QUEUE_LABEL: queue} if queue else {}
    return {"metadata": {"name": "j", "namespace": "ns", "labels": labels}, "spec": spec}


@pytest.mark.parametrize(
    ("queue", "spec", "held"),
    [
        ("q", {"suspend": True}, True),  # batch/v1 Job waiting for admission
        ("q", {"runPolicy": {"suspend": True}}, True),  # Kubeflow job waiting
        ("q", {"suspend": False}, False),  # admitted: Kueue unsuspended it
        ("q", {}, False),
        (None, {"suspend": True}, False),  # suspended by its owner, not queued: not Kueue's
        ("", {"suspend": True}, False),
    ],
)
def test_kueue_holds_only_queued_suspended_jobs(
    queue: str | None, spec: dict[str, Any], held: bool
) -> None:
    reason = kueue_hold(job(queue=queue, spec=spec))
    assert (reason is not None) == held
    if reason is not None:
        assert reason.startswith(KUEUE_HOLD_PREFIX) and "'q'" in reason


def pod(name: str, created: str, phase: str = "Running") -> dict[str, Any]:
    return {"metadata": {"name": name, "creationTimestamp": created}, "status": {"phase": phase}}


def test_workers_to_delete_takes_pending_then_youngest() -> None:
    pods = [
        pod("old", "2026-01-01T10:00:00Z"),
        pod("young", "2026-01-01T12:00:00Z"),
        pod("mid", "2026-01-01T11:00:00Z"),
        pod("waiting", "2026-01-01T09:00:00Z", phase="Pending"),
        pod("b-twin", "2026-01-01T12:00:00Z"),
    ]
    assert workers_to_delete(pods, 5) == []
    assert workers_to_delete(pods, 9) == []
    assert workers_to_delete(pods, 4) == ["waiting"]
    assert workers_to_delete(pods, 2) == ["waiting", "b-twin", "young"]
    assert workers_to_delete(pods, -1) == ["waiting", "b-twin", "young", "mid", "old"]


def ray(groups: list[dict[str, Any]], annotations: dict[str, str] | None = None) -> dict[str, Any]:
    return {
        "apiVersion": "ray.io/v1",
        "kind": "RayCluster",
        "metadata": {
            "name": "rc",
            "namespace": "ns",
            "labels": {"tideshift.io/role": "training"},
            "annotations": annotations or {},
        },
        "spec": {"headGroupSpec": {}, "workerGroupSpecs": groups},
        "status": {"readyWorkerReplicas": 2},
    }


def group(name: str, replicas: int, low: int = 1, high: int = 5) -> dict[str, Any]:
    container = {"name": "w", "resources": {"requests": {"cpu": "500m"}}}
    return {
        "groupName": name,
        "replicas": replicas,
        "minReplicas": low,
        "maxReplicas": high,
        "template": {"spec": {"containers": [container]}},
    }


TARGET = WorkloadRef("ns", RAY_CLUSTER, "rc")


def test_raycluster_is_a_known_kind_with_an_adapter() -> None:
    assert qualified_kind("RayCluster", "ray.io/v1") == RAY_CLUSTER
    assert API_VERSION[RAY_CLUSTER] == "ray.io/v1"
    assert normalise_kind("raycluster") == RAY_CLUSTER
    assert isinstance(default_adapters()[RAY_CLUSTER], RayClusterAdapter)


def test_ray_worker_group_scale_and_bounds() -> None:
    adapter = RayClusterAdapter()
    state = adapter.observe(TARGET, ray([group("workers", 3, low=2, high=6)]))
    assert (state.replicas, state.ready_replicas) == (3, 2)
    assert (state.min_replicas, state.max_replicas) == (2, 6)
    # The annotations narrow the group's own bounds.
    narrowed = ray([group("workers", 3)], {"tideshift.io/max-replicas": "4"})
    assert adapter.observe(TARGET, narrowed).max_replicas == 4


def test_ray_write_sends_every_group_and_names_the_workers_to_delete() -> None:
    adapter = RayClusterAdapter()
    obj = ray([group("cpu", 2), group("gpu", 3)], {"tideshift.io/scale-group": "gpu"})
    assert adapter.observe(TARGET, obj).replicas == 3
    patch = adapter.scaled_deleting(obj, 1, ["rc-gpu-a", "rc-gpu-b"])
    groups = patch["spec"]["workerGroupSpecs"]
    assert [g["replicas"] for g in groups] == [2, 1]
    assert groups[1]["scaleStrategy"] == {"workersToDelete": ["rc-gpu-a", "rc-gpu-b"]}
    assert "scaleStrategy" not in groups[0]
    # Growing clears what an earlier shrink named.
    grown = adapter.scaled(obj, 5)["spec"]["workerGroupSpecs"][1]
    assert (grown["replicas"], grown["scaleStrategy"]) == (5, {"workersToDelete": []})
    assert adapter.pod_spec(obj) == obj["spec"]["workerGroupSpecs"][1]["template"]["spec"]


def test_ray_group_must_be_named_when_there_are_several() -> None:
    adapter = RayClusterAdapter()
    with pytest.raises(UnsupportedTarget, match=r"tideshift\.io/scale-group"):
        adapter.observe(TARGET, ray([group("cpu", 2), group("gpu", 3)]))
    with pytest.raises(
        UnsupportedTarget, match=r"'tpu' names no worker group \(worker groups: \['cpu'\]\)"
    ):
        adapter.observe(TARGET, ray([group("cpu", 2)], {"tideshift.io/scale-group": "tpu"}))


def test_a_held_kueue_job_is_listed_as_unscalable_with_the_reason() -> None:
    adapter = default_adapters()["Job.batch"]
    obj = job(queue="q", spec={"suspend": True, "parallelism": 2, "template": {"spec": {}}})
    obj["metadata"]["labels"]["tideshift.io/role"] = "training"
    workload = workload_from_object(adapter, obj)
    assert (workload.unscalable or "").startswith(KUEUE_HOLD_PREFIX)
    obj["spec"]["suspend"] = False
    assert workload_from_object(adapter, obj).unscalable in (None, "")
