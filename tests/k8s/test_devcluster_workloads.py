"""The local control plane as `tideshift dev cluster up` leaves it: training pods keep
running, the training kinds' CRDs are served, and claims on the default class bind."""

from __future__ import annotations

from typing import Any

import yaml

from tests.k8s.cluster_objects import create, pod_template, wait_until
from tideshift.services.cluster.adapters.http import KubeHttp
from tideshift.services.devcluster.kwok_stages import pod_stages
from tideshift.services.devcluster.storage import DEFAULT_CLASS_ANNOTATION, STORAGE_CLASS


def test_kwok_pod_stages_never_complete_a_pod() -> None:
    stages = pod_stages()
    assert {s["spec"]["resourceRef"]["kind"] for s in stages} == {"Pod"}
    templates = yaml.safe_dump([s["spec"]["next"] for s in stages])
    assert "Succeeded" not in templates and "terminated" not in templates


def test_batch_job_pods_stay_running_until_deleted(admin: KubeHttp, k8s_namespace: str) -> None:
    template = pod_template({"app": "trainer"})
    template["spec"]["restartPolicy"] = "Never"
    job = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": "trainer"},
        "spec": {"parallelism": 2, "completions": 2, "template": template},
    }
    jobs = f"/apis/batch/v1/namespaces/{k8s_namespace}/jobs"
    create(admin, jobs, job)

    def pods() -> list[dict[str, Any]]:
        listed = admin.get(
            f"/api/v1/namespaces/{k8s_namespace}/pods", query=[("labelSelector", "app=trainer")]
        )
        return list(listed.get("items") or [])

    def both_ready() -> bool:
        status = admin.get(f"{jobs}/trainer").get("status") or {}
        return status.get("ready") == 2

    wait_until(both_ready, what="the Job's two pods ready")
    assert [p["status"]["phase"] for p in pods()] == ["Running", "Running"]
    status = admin.get(f"{jobs}/trainer").get("status") or {}
    assert not status.get("succeeded") and status.get("active") == 2

    admin.json("DELETE", f"/api/v1/namespaces/{k8s_namespace}/pods/{pods()[0]['metadata']['name']}")
    # The Job controller replaces the deleted pod; nothing completed.
    wait_until(lambda: both_ready() and len(pods()) == 2, what="a replacement pod ready")
    assert not (admin.get(f"{jobs}/trainer").get("status") or {}).get("succeeded")


def test_training_crds_are_served(admin: KubeHttp) -> None:
    for group_version in ("batch.volcano.sh/v1alpha1", "kubeflow.org/v1"):
        resources = admin.get(f"/apis/{group_version}").get("resources") or []
        assert resources, group_version


def test_a_claim_on_the_default_class_binds(admin: KubeHttp, k8s_namespace: str) -> None:
    storage_class = admin.get(f"/apis/storage.k8s.io/v1/storageclasses/{STORAGE_CLASS}")
    assert storage_class["metadata"]["annotations"][DEFAULT_CLASS_ANNOTATION] == "true"
    claims = f"/api/v1/namespaces/{k8s_namespace}/persistentvolumeclaims"
    claim = {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {"name": "data"},
        "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "5Gi"}}},
    }
    create(admin, claims, claim)
    bound = wait_until(
        lambda: (
            (admin.get(f"{claims}/data").get("status") or {}).get("phase") == "Bound"
            and admin.get(f"{claims}/data")
        ),
        what="the claim bound",
    )
    assert bound["spec"]["storageClassName"] == STORAGE_CLASS
