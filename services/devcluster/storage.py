"""A default StorageClass whose claims bind, for the local control plane.

There is no volume provisioner on kwok nodes, so the class (`tideshift-local`, the cluster
default) uses no provisioner and `tideshift dev cluster up` creates a pool of pre-made
hostPath PersistentVolumes in it; the controller-manager binds each new claim to a free one
at once. That is what the chart's default install needs (the bundled NATS asks for a claim).
Volumes are kept after their claim is deleted (`Retain`): the pool is for trying things,
not for churn.
"""

from __future__ import annotations

from typing import Any

STORAGE_CLASS = "tideshift-local"
DEFAULT_CLASS_ANNOTATION = "storageclass.kubernetes.io/is-default-class"


def storage_class() -> dict[str, Any]:
    return {
        "apiVersion": "storage.k8s.io/v1",
        "kind": "StorageClass",
        "metadata": {"name": STORAGE_CLASS, "annotations": {DEFAULT_CLASS_ANNOTATION: "true"}},
        "provisioner": "kubernetes.io/no-provisioner",
        "reclaimPolicy": "Retain",
        "volumeBindingMode": "Immediate",
    }


def volumes(count: int, size: str) -> list[dict[str, Any]]:
    """`count` volumes of `size` each in the class (fake: kwok pods never touch them)."""
    return [
        {
            "apiVersion": "v1",
            "kind": "PersistentVolume",
            "metadata": {"name": f"{STORAGE_CLASS}-{index}"},
            "spec": {
                "storageClassName": STORAGE_CLASS,
                "capacity": {"storage": size},
                "accessModes": ["ReadWriteOnce"],
                "persistentVolumeReclaimPolicy": "Retain",
                "hostPath": {"path": f"/tmp/{STORAGE_CLASS}/{index}"},
            },
        }
        for index in range(count)
    ]


def install_storage(api_client: Any, *, count: int = 8, size: str = "20Gi") -> None:
    """Create the default class and its volumes (existing ones are left as they are)."""
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    def create(call: Any, body: dict[str, Any]) -> None:
        try:
            call(body)
        except ApiException as error:
            if error.status != 409:
                raise

    create(client.StorageV1Api(api_client).create_storage_class, storage_class())
    core = client.CoreV1Api(api_client)
    for volume in volumes(count, size):
        create(core.create_persistent_volume, volume)
