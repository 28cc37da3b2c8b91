"""Per-kind adapters on objects as the apiserver returns them, and kind spellings."""

from __future__ import annotations

from typing import Any

import pytest

from tideshift.events import WorkloadRef
from tideshift.services.cluster.adapters.kinds import (
    VOLCANO_JOB,
    normalise_kind,
    qualified_kind,
    split_kind,
    to_target,
    to_workload_ref,
)
from tideshift.services.cluster.adapters.targets import (
    BatchJobAdapter,
    DeploymentAdapter,
    PyTorchJobAdapter,
    VolcanoJobAdapter,
    annotation_bounds,
    default_adapters,
)
from tideshift.services.cluster.port import TargetRef, UnsupportedTarget


def meta(**annotations: str) -> dict[str, Any]:
    return {"name": "x", "namespace": "ns", "resourceVersion": "7", "annotations": annotations}


@pytest.mark.parametrize(
    ("annotations", "expected"),
    [
        ({}, (0, None)),
        ({"tideshift.io/min-replicas": "2", "tideshift.io/max-replicas": "9"}, (2, 9)),
        ({"tideshift.io/min-replicas": "two"}, (0, None)),  # unreadable: ignored
        ({"tideshift.io/max-replicas": "-1"}, (0, None)),
    ],
)
def test_annotation_bounds(annotations: dict[str, str], expected: tuple[int, int | None]) -> None:
    assert annotation_bounds({"metadata": meta(**annotations)}) == expected


def test_deployment_reads_replicas_ready_and_annotated_bounds() -> None:
    target = TargetRef("ns", "Deployment", "x")
    obj = {
        "metadata": meta(**{"tideshift.io/max-replicas": "4"}),
        "spec": {"replicas": 3},
        "status": {"readyReplicas": 2},
    }
    state = DeploymentAdapter().observe(target, obj)
    assert (state.replicas, state.ready_replicas, state.min_replicas, state.max_replicas) == (
        3,
        2,
        0,
        4,
    )


def test_job_scales_parallelism() -> None:
    adapter = BatchJobAdapter()
    obj = {"metadata": meta(), "spec": {"parallelism": 2}, "status": {"active": 2, "ready": 1}}
    state = adapter.observe(TargetRef("ns", "Job", "x"), obj)
    assert (state.replicas, state.ready_replicas) == (2, 1)
    assert adapter.scaled(obj, 5) == {"spec": {"parallelism": 5}}


def volcano(tasks: list[dict[str, Any]], min_available: int | None = None, **ann: str) -> Any:
    spec: dict[str, Any] = {"tasks": tasks}
    if min_available is not None:
        spec["minAvailable"] = min_available
    return {"metadata": meta(**ann), "spec": spec}


@pytest.mark.parametrize(
    ("obj", "replicas", "low"),
    [
        # The job needs 4; the ps task gives 1, so the workers may not go below 3.
        (
            volcano([{"name": "ps", "replicas": 1}, {"name": "worker", "replicas": 6}], 4),
            6,
            3,
        ),
        # The task's own minAvailable is stricter.
        (
            volcano(
                [
                    {"name": "ps", "replicas": 1},
                    {"name": "worker", "replicas": 6, "minAvailable": 5},
                ],
                2,
            ),
            6,
            5,
        ),
        # A single task of another name is the one scaled.
        (volcano([{"name": "trainer", "replicas": 2}], 1), 2, 1),
        # The annotation picks the task.
        (
            volcano(
                [{"name": "a", "replicas": 1}, {"name": "b", "replicas": 3}],
                None,
                **{"tideshift.io/scale-task": "b"},
            ),
            3,
            0,
        ),
    ],
)
def test_volcano_job_keeps_min_available_valid(obj: Any, replicas: int, low: int) -> None:
    state = VolcanoJobAdapter().observe(TargetRef("ns", VOLCANO_JOB, "x"), obj)
    assert (state.replicas, state.min_replicas) == (replicas, low)


def test_volcano_patch_rewrites_only_the_scaled_task() -> None:
    obj = volcano(
        [{"name": "ps", "replicas": 1, "template": {"a": 1}}, {"name": "worker", "replicas": 2}]
    )
    patch = VolcanoJobAdapter().scaled(obj, 5)
    assert patch == {
        "spec": {
            "tasks": [
                {"name": "ps", "replicas": 1, "template": {"a": 1}},
                {"name": "worker", "replicas": 5},
            ]
        }
    }
    assert obj["spec"]["tasks"][1]["replicas"] == 2  # the read object is not mutated


def test_volcano_with_ambiguous_tasks_is_unsupported() -> None:
    obj = volcano([{"name": "a", "replicas": 1}, {"name": "b", "replicas": 1}])
    with pytest.raises(UnsupportedTarget, match=r"tideshift\.io/scale-task"):
        VolcanoJobAdapter().observe(TargetRef("ns", VOLCANO_JOB, "x"), obj)


def pytorch(elastic: dict[str, Any] | None, workers: int = 2, **ann: str) -> Any:
    spec: dict[str, Any] = {"pytorchReplicaSpecs": {"Worker": {"replicas": workers}}}
    if elastic is not None:
        spec["elasticPolicy"] = elastic
    return {"metadata": meta(**ann), "spec": spec}


@pytest.mark.parametrize(
    ("obj", "bounds"),
    [
        (pytorch({"minReplicas": 1, "maxReplicas": 8}), (1, 8)),
        (
            pytorch({"minReplicas": 1, "maxReplicas": 8}, **{"tideshift.io/max-replicas": "4"}),
            (1, 4),
        ),
        (pytorch({"minReplicas": 2}, **{"tideshift.io/min-replicas": "3"}), (3, None)),
    ],
)
def test_pytorch_job_bounds_come_from_elastic_policy(
    obj: Any, bounds: tuple[int, int | None]
) -> None:
    state = PyTorchJobAdapter().observe(TargetRef("ns", "PyTorchJob", "x"), obj)
    assert (state.min_replicas, state.max_replicas) == bounds
    assert PyTorchJobAdapter().scaled(obj, 3) == {
        "spec": {"pytorchReplicaSpecs": {"Worker": {"replicas": 3}}}
    }


def test_non_elastic_pytorch_job_is_unsupported() -> None:
    with pytest.raises(UnsupportedTarget, match="elasticPolicy"):
        PyTorchJobAdapter().observe(TargetRef("ns", "PyTorchJob", "x"), pytorch(None))


@pytest.mark.parametrize(
    ("kind", "api_version", "qualified"),
    [
        ("Deployment", "apps/v1", "Deployment"),
        ("Job", "batch/v1", "Job"),
        ("Job", "batch.volcano.sh/v1alpha1", VOLCANO_JOB),
        ("PyTorchJob", "kubeflow.org/v1", "PyTorchJob"),
        ("Deployment", "", "Deployment"),
        ("Widget", "example.com/v1", "Widget.example.com"),
    ],
)
def test_kind_spellings_round_trip(kind: str, api_version: str, qualified: str) -> None:
    assert qualified_kind(kind, api_version) == qualified
    ref = WorkloadRef(kind=kind, namespace="ns", name="x", api_version=api_version)
    target = to_target(ref)
    assert target.kind == qualified
    if qualified in default_adapters():
        assert to_workload_ref(target).kind == kind
        assert split_kind(qualified)[1] == (api_version or split_kind(qualified)[1])


@pytest.mark.parametrize(
    ("text", "kind"),
    [("deploy", "Deployment"), ("STS", "StatefulSet"), ("vcjob", VOLCANO_JOB), ("pod", None)],
)
def test_command_line_kinds(text: str, kind: str | None) -> None:
    assert normalise_kind(text) == kind
