"""Per-kind adapters on objects as the apiserver returns them, and kind spellings."""

from __future__ import annotations

from typing import Any

import pytest

from tideshift.events import WorkloadRef
from tideshift.services.cluster.adapters.targets import (
    BatchJobAdapter,
    DeploymentAdapter,
    PyTorchJobAdapter,
    VolcanoJobAdapter,
    annotation_bounds,
    default_adapters,
)
from tideshift.services.cluster.core.kinds import (
    API_VERSION,
    VOLCANO_JOB,
    normalise_kind,
    qualified_kind,
)
from tideshift.services.cluster.port import UnsupportedTarget


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
    target = WorkloadRef("ns", "Deployment", "x")
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
    state = adapter.observe(WorkloadRef("ns", "Job", "x"), obj)
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
    state = VolcanoJobAdapter().observe(WorkloadRef("ns", VOLCANO_JOB, "x"), obj)
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
        VolcanoJobAdapter().observe(WorkloadRef("ns", VOLCANO_JOB, "x"), obj)


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
    state = PyTorchJobAdapter().observe(WorkloadRef("ns", "PyTorchJob", "x"), obj)
    assert (state.min_replicas, state.max_replicas) == bounds
    assert PyTorchJobAdapter().scaled(obj, 3) == {
        "spec": {"pytorchReplicaSpecs": {"Worker": {"replicas": 3}}}
    }


def test_non_elastic_pytorch_job_is_unsupported() -> None:
    with pytest.raises(UnsupportedTarget, match="elasticPolicy"):
        PyTorchJobAdapter().observe(WorkloadRef("ns", "PyTorchJob", "x"), pytorch(None))


@pytest.mark.parametrize(
    ("kind", "api_version", "qualified"),
    [
        ("Deployment", "apps/v1", "Deployment.apps"),
        ("Job", "batch/v1", "Job.batch"),
        ("Job", "batch.volcano.sh/v1alpha1", VOLCANO_JOB),
        ("PyTorchJob", "kubeflow.org/v1", "PyTorchJob.kubeflow.org"),
        ("Pod", "v1", "Pod"),
        ("Widget", "example.com/v1", "Widget.example.com"),
    ],
)
def test_owner_kinds_are_group_qualified_and_round_trip(
    kind: str, api_version: str, qualified: str
) -> None:
    assert qualified_kind(kind, api_version) == qualified
    ref = WorkloadRef("ns", qualified_kind(kind, api_version), "x")
    assert str(ref) == f"{qualified}/ns/x"
    assert WorkloadRef.parse(str(ref)) == ref
    assert ref.plain_kind == kind


def test_every_adapter_kind_has_an_api_version() -> None:
    assert set(default_adapters()) == set(API_VERSION)


@pytest.mark.parametrize(
    ("text", "problem"),
    [("Deployment/web", "Kind.group/namespace/name"), ("deploy/ns/web", "Kind.group")],
)
def test_bad_identity_text_names_what_was_expected(text: str, problem: str) -> None:
    with pytest.raises(ValueError, match=problem):
        WorkloadRef.parse(text)


@pytest.mark.parametrize(
    ("text", "kind"),
    [
        ("deploy", "Deployment.apps"),
        ("STS", "StatefulSet.apps"),
        ("vcjob", VOLCANO_JOB),
        ("pod", None),
    ],
)
def test_command_line_kinds(text: str, kind: str | None) -> None:
    assert normalise_kind(text) == kind
