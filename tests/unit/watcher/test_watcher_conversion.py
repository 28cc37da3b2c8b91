"""Kubernetes objects -> port values -> events: owners, roles, requests, real differences."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

import pytest

from tideshift.services.cluster.core.conversions import (
    diff,
    direct_owner,
    node_from_object,
    pod_batch_requests,
    pod_from_object,
    pod_requests,
    role_of,
)
from tideshift.services.cluster.informer import Informer, WatchTuning
from tideshift.services.cluster.port import Node, Pod, Resources, WorkloadRef
from tideshift.services.watcher.core.snapshot import node_key, pod_event, pod_key, same_state

AT = datetime(2026, 1, 1, tzinfo=UTC)


def no_lookup(namespace: str, reference: Mapping[str, Any]) -> WorkloadRef | None:
    return direct_owner(namespace, reference)


def pod_object(**overrides: Any) -> dict[str, Any]:
    obj: dict[str, Any] = {
        "metadata": {
            "name": "web-1",
            "namespace": "shop",
            "uid": "u1",
            "resourceVersion": "10",
            "creationTimestamp": "2026-01-01T00:00:00Z",
            "labels": {"app": "web"},
        },
        "spec": {
            "nodeName": "n1",
            "priority": 100,
            "priorityClassName": "serving",
            "containers": [
                {"name": "a", "resources": {"requests": {"cpu": "250m", "memory": "1Gi"}}},
                {"name": "b", "resources": {"requests": {"cpu": "1", "nvidia.com/gpu": "1"}}},
            ],
        },
        "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]},
    }
    for key, value in overrides.items():
        obj[key] = value
    return obj


def test_pod_conversion_reads_what_the_planner_needs() -> None:
    pod = pod_from_object(pod_object(), no_lookup)
    assert pod.requests == Resources(cpu=1.25, memory=2**30, gpu=1)
    assert (pod.phase, pod.node, pod.ready, pod.priority) == ("Running", "n1", True, 100)
    assert pod.priority_class == "serving"
    assert pod.resource_version == "10" and pod.uid == "u1" and not pod.deleting
    assert pod.created_at == AT.timestamp()
    assert pod.owner is None and pod.role == "other"


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        # The largest init container exceeds the running containers' sum.
        (
            {
                "initContainers": [{"resources": {"requests": {"cpu": "2"}}}],
                "containers": [{"resources": {"requests": {"cpu": "500m"}}}],
            },
            Resources(cpu=2.0),
        ),
        # Native sidecars (restartPolicy Always) run beside the containers.
        (
            {
                "initContainers": [
                    {"restartPolicy": "Always", "resources": {"requests": {"cpu": "100m"}}}
                ],
                "containers": [{"resources": {"requests": {"cpu": "500m"}}}],
                "overhead": {"cpu": "50m"},
            },
            Resources(cpu=0.65),
        ),
        ({"containers": [{"name": "no-requests"}]}, Resources()),
    ],
)
def test_pod_requests(spec: dict[str, Any], expected: Resources) -> None:
    got = pod_requests(spec)
    assert got.cpu == pytest.approx(expected.cpu)
    assert (got.memory, got.gpu) == (expected.memory, expected.gpu)


def test_pod_batch_requests_are_what_the_containers_borrow() -> None:
    spec = {
        "containers": [
            {"resources": {"requests": {"cpu": "100m", "tideshift.io/batch-cpu": "1500"}}},
            {"resources": {"requests": {"tideshift.io/batch-memory": "1Gi"}}},
            {"name": "no-requests"},
        ]
    }
    # millicores as cores; the plain cpu request is not borrowed
    assert pod_batch_requests(spec) == Resources(cpu=1.5, memory=2**30)
    assert pod_requests(spec).cpu == pytest.approx(0.1)


@pytest.mark.parametrize(
    ("reference", "kind", "role"),
    [
        ({"kind": "StatefulSet", "apiVersion": "apps/v1", "name": "db"}, "StatefulSet", "other"),
        ({"kind": "Job", "apiVersion": "batch/v1", "name": "j"}, "Job", "other"),
        (
            {"kind": "Job", "apiVersion": "batch.volcano.sh/v1alpha1", "name": "j"},
            "Job.batch.volcano.sh",
            "training",
        ),
        (
            {"kind": "PyTorchJob", "apiVersion": "kubeflow.org/v1", "name": "p"},
            "PyTorchJob",
            "training",
        ),
    ],
)
def test_owner_kinds_and_default_roles(reference: dict[str, Any], kind: str, role: str) -> None:
    obj = pod_object()
    obj["metadata"]["ownerReferences"] = [{**reference, "controller": True, "uid": "o"}]
    pod = pod_from_object(obj, no_lookup)
    assert pod.owner == WorkloadRef("shop", kind, reference["name"])
    assert pod.role == role


def test_replica_set_owner_goes_through_the_resolver() -> None:
    obj = pod_object()
    obj["metadata"]["ownerReferences"] = [
        {"kind": "ReplicaSet", "apiVersion": "apps/v1", "name": "web-5d8", "controller": True}
    ]

    def resolve(namespace: str, reference: Mapping[str, Any]) -> WorkloadRef | None:
        assert reference["name"] == "web-5d8"
        return WorkloadRef(namespace, "Deployment", "web")

    assert pod_from_object(obj, resolve).owner == WorkloadRef("shop", "Deployment", "web")


@pytest.mark.parametrize(
    ("labels", "annotations", "owner_kind", "role"),
    [
        ({"tideshift.io/role": "serving"}, {}, None, "serving"),
        ({}, {"tideshift.io/role": "training"}, None, "training"),
        ({"tideshift.io/role": "serving"}, {"tideshift.io/role": "training"}, None, "serving"),
        ({"tideshift.io/role": "bogus"}, {}, "PyTorchJob", "training"),
        ({"tideshift.io/role": "other"}, {}, "PyTorchJob", "other"),
        ({}, {}, "Deployment", "other"),
    ],
)
def test_role_resolution(
    labels: dict[str, str], annotations: dict[str, str], owner_kind: str | None, role: str
) -> None:
    owner = WorkloadRef("ns", owner_kind, "x") if owner_kind else None
    assert role_of(labels, annotations, owner) == role


def test_unknown_phase_and_deletion_are_read() -> None:
    obj = pod_object(status={"phase": "Unknown"})
    obj["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:05Z"
    pod = pod_from_object(obj, no_lookup)
    assert pod.phase == "Pending" and pod.deleting and not pod.ready


def test_node_conversion() -> None:
    node = node_from_object(
        {
            "metadata": {"name": "gpu-1", "labels": {"b": "2", "a": "1"}, "resourceVersion": "5"},
            "spec": {"unschedulable": True},
            "status": {
                "allocatable": {"cpu": "8", "memory": "32Gi", "nvidia.com/gpu": "4"},
                "conditions": [{"type": "Ready", "status": "False"}],
            },
        }
    )
    assert node.allocatable == Resources(cpu=8, memory=32 * 2**30, gpu=4)
    assert (node.ready, node.unschedulable, node.labels) == (False, True, (("a", "1"), ("b", "2")))


def test_diff_reports_only_real_differences() -> None:
    a = Node("a", Resources(cpu=1), resource_version="1")
    b = Node("b", Resources(cpu=1), resource_version="1")
    b_heartbeat = Node("b", Resources(cpu=1), resource_version="2")  # only the version moved
    c = Node("c", Resources(cpu=1), resource_version="3")
    a_changed = Node("a", Resources(cpu=2), resource_version="4")
    changes = diff({"a": a, "b": b}, {"a": a_changed, "b": b_heartbeat, "c": c})
    assert [(change.type, change.obj) for change in changes] == [
        ("modified", a_changed),
        ("added", c),
    ]
    assert [(c.type, c.obj) for c in diff({"a": a}, {})] == [("deleted", a)]


def test_informer_folds_events_and_skips_bad_objects() -> None:
    informer = Informer[Node](
        None,  # type: ignore[arg-type]  # apply() does no I/O
        resource="nodes",
        path="/api/v1/nodes",
        convert=node_from_object,
        key=lambda node: node.name,
        label_selector=None,
        tuning=WatchTuning(),
    )
    raw = {"metadata": {"name": "n", "resourceVersion": "1"}, "status": {}}
    added = informer.apply("ADDED", raw)
    assert added is not None and added.type == "added"
    heartbeat = {"metadata": {"name": "n", "resourceVersion": "2"}, "status": {}}
    assert informer.apply("MODIFIED", heartbeat) is None
    assert informer.resource_version == "2"
    assert informer.apply("MODIFIED", {"metadata": {"resourceVersion": "3"}}) is None  # no name
    assert informer.resource_version == "3"
    deleted = informer.apply("DELETED", heartbeat)
    assert deleted is not None and deleted.type == "deleted"
    assert informer.apply("DELETED", heartbeat) is None  # already gone


def test_pod_event_and_snapshot_keys() -> None:
    pod = Pod(
        "shop",
        "web.v2-1",
        Resources(cpu=0.5),
        owner=WorkloadRef("shop", "Job.batch.volcano.sh", "train"),
        role="training",
        phase="Running",
        node="n1",
        resource_version="9",
    )
    event = pod_event("added", pod, observed_at=AT)
    assert event.owner is not None
    assert event.owner.kind == "Job.batch.volcano.sh"
    assert pod_key("shop", "web.v2-1") == "pod.shop.web_2Ev2-1"
    assert node_key("n.1") == "node.n_2E1"
    later = pod_event("modified", pod, observed_at=datetime(2026, 1, 2, tzinfo=UTC))
    assert same_state(event, later)
    moved = pod_event(
        "modified", Pod("shop", "web.v2-1", Resources(cpu=0.5), node="n2"), observed_at=AT
    )
    assert not same_state(event, moved)


def test_companion_label_reaches_the_pod_event() -> None:
    labelled = pod_object()
    labelled["metadata"]["labels"] = {"tideshift.io/companion": "true"}
    pserver = pod_from_object(labelled, no_lookup)
    trainer = pod_from_object(pod_object(), no_lookup)
    assert pod_event("added", pserver, observed_at=AT).companion
    assert not pod_event("added", trainer, observed_at=AT).companion
