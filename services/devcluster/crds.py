"""The structural CRDs of the training kinds Tideshift scales, for the local control plane.

`tideshift dev cluster up` installs them (unless `--no-crds`) so a user can create Volcano
Jobs and Kubeflow PyTorchJobs there; nothing runs them (no Volcano or training operator),
kwok plays their pods. Only the fields Tideshift reads or writes are typed; the rest is kept.
"""

from __future__ import annotations

import time
from typing import Any

ANY_OBJECT: dict[str, Any] = {"type": "object", "x-kubernetes-preserve-unknown-fields": True}

VOLCANO_CRD: dict[str, Any] = {
    "apiVersion": "apiextensions.k8s.io/v1",
    "kind": "CustomResourceDefinition",
    "metadata": {"name": "jobs.batch.volcano.sh"},
    "spec": {
        "group": "batch.volcano.sh",
        "names": {
            "kind": "Job",
            "plural": "jobs",
            "singular": "job",
            "shortNames": ["vcjob", "vj"],
        },
        "scope": "Namespaced",
        "versions": [
            {
                "name": "v1alpha1",
                "served": True,
                "storage": True,
                "subresources": {"status": {}},
                "schema": {
                    "openAPIV3Schema": {
                        "type": "object",
                        "properties": {
                            "spec": {
                                "type": "object",
                                "x-kubernetes-preserve-unknown-fields": True,
                                "properties": {
                                    "minAvailable": {"type": "integer", "minimum": 0},
                                    "tasks": {
                                        "type": "array",
                                        "items": {
                                            "type": "object",
                                            "x-kubernetes-preserve-unknown-fields": True,
                                            "properties": {
                                                "name": {"type": "string"},
                                                "replicas": {"type": "integer", "minimum": 0},
                                                "minAvailable": {"type": "integer", "minimum": 0},
                                                "template": ANY_OBJECT,
                                            },
                                        },
                                    },
                                },
                            },
                            "status": ANY_OBJECT,
                        },
                    }
                },
            }
        ],
    },
}

PYTORCH_CRD: dict[str, Any] = {
    "apiVersion": "apiextensions.k8s.io/v1",
    "kind": "CustomResourceDefinition",
    "metadata": {"name": "pytorchjobs.kubeflow.org"},
    "spec": {
        "group": "kubeflow.org",
        "names": {"kind": "PyTorchJob", "plural": "pytorchjobs", "singular": "pytorchjob"},
        "scope": "Namespaced",
        "versions": [
            {
                "name": "v1",
                "served": True,
                "storage": True,
                "subresources": {"status": {}},
                "schema": {
                    "openAPIV3Schema": {
                        "type": "object",
                        "properties": {
                            "spec": {
                                "type": "object",
                                "x-kubernetes-preserve-unknown-fields": True,
                                "properties": {
                                    "elasticPolicy": {
                                        "type": "object",
                                        "x-kubernetes-preserve-unknown-fields": True,
                                        "properties": {
                                            "minReplicas": {"type": "integer", "minimum": 0},
                                            "maxReplicas": {"type": "integer", "minimum": 0},
                                        },
                                    },
                                    "pytorchReplicaSpecs": {
                                        "type": "object",
                                        "additionalProperties": {
                                            "type": "object",
                                            "x-kubernetes-preserve-unknown-fields": True,
                                            "properties": {
                                                "replicas": {"type": "integer", "minimum": 0},
                                                "template": ANY_OBJECT,
                                            },
                                        },
                                    },
                                },
                            },
                            "status": ANY_OBJECT,
                        },
                    }
                },
            }
        ],
    },
}


WORKLOAD_CRDS = (VOLCANO_CRD, PYTORCH_CRD)


def install_crds(api_client: Any, *, timeout: float = 60.0) -> None:
    """Create the CRDs (an existing one is left as it is) and wait until they are served."""
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    extensions = client.ApiextensionsV1Api(api_client)
    for crd in WORKLOAD_CRDS:
        try:
            body: Any = crd  # the client accepts the manifest as a dict
            extensions.create_custom_resource_definition(body)
        except ApiException as error:
            if error.status != 409:
                raise
    deadline = time.monotonic() + timeout
    for crd in WORKLOAD_CRDS:
        name = crd["metadata"]["name"]
        while True:
            status = extensions.read_custom_resource_definition(name).status
            conditions = (status.conditions if status is not None else None) or []
            if any(c.type == "Established" and c.status == "True" for c in conditions):
                break
            if time.monotonic() > deadline:
                raise TimeoutError(f"CRD {name} not established within {timeout:.0f}s")
            time.sleep(0.05)
