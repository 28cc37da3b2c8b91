"""The structural CRDs of the training kinds Tideshift scales, and of KEDA's ScaledObject
(which Tideshift leaves a Deployment's replicas to), for the local control plane.

`tideshift dev cluster up` installs them (unless `--no-crds`) so a user can create Volcano
Jobs and Kubeflow PyTorchJobs there. Volcano is not built here (its module is not served by
this machine's Go module proxy), so nothing runs its Jobs and kwok plays no pods for them.
When the real training operator runs (engines.py, the default of `dev cluster up`), its own
PyTorchJob CRD replaces the structural one and it creates the pods; without it, nothing runs
PyTorchJobs either. Only the fields Tideshift reads or writes are typed; the rest is kept.
"""

from __future__ import annotations

import time
from typing import Any

ANY_OBJECT: dict[str, Any] = {"type": "object", "x-kubernetes-preserve-unknown-fields": True}

COUNT: dict[str, Any] = {"type": "integer", "minimum": 0}


def _kept(properties: dict[str, Any]) -> dict[str, Any]:
    """An object schema typing `properties` and keeping every other field."""
    return {**ANY_OBJECT, "properties": properties}


def _crd(group: str, version: str, names: dict[str, Any], spec: dict[str, Any]) -> dict[str, Any]:
    """A namespaced CRD with a status subresource, whose spec schema types `spec`."""
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{names['plural']}.{group}"},
        "spec": {
            "group": group,
            "names": names,
            "scope": "Namespaced",
            "versions": [
                {
                    "name": version,
                    "served": True,
                    "storage": True,
                    "subresources": {"status": {}},
                    "schema": {
                        "openAPIV3Schema": {
                            "type": "object",
                            "properties": {"spec": _kept(spec), "status": ANY_OBJECT},
                        }
                    },
                }
            ],
        },
    }


VOLCANO_CRD = _crd(
    "batch.volcano.sh",
    "v1alpha1",
    {"kind": "Job", "plural": "jobs", "singular": "job", "shortNames": ["vcjob", "vj"]},
    {
        "minAvailable": COUNT,
        "tasks": {
            "type": "array",
            "items": _kept(
                {
                    "name": {"type": "string"},
                    "replicas": COUNT,
                    "minAvailable": COUNT,
                    "template": ANY_OBJECT,
                }
            ),
        },
    },
)

PYTORCH_CRD = _crd(
    "kubeflow.org",
    "v1",
    {"kind": "PyTorchJob", "plural": "pytorchjobs", "singular": "pytorchjob"},
    {
        "elasticPolicy": _kept({"minReplicas": COUNT, "maxReplicas": COUNT}),
        "pytorchReplicaSpecs": {
            "type": "object",
            "additionalProperties": _kept({"replicas": COUNT, "template": ANY_OBJECT}),
        },
    },
)


WORKLOAD_CRDS = (VOLCANO_CRD, PYTORCH_CRD)

# KEDA's ScaledObject (keda.sh/v1alpha1), so that one can be created beside a Deployment and
# Tideshift seen to leave that Deployment's replicas to it. KEDA itself is not built here:
# nothing turns a ScaledObject into an HPA, and nothing scales by its triggers.
KEDA_SCALED_OBJECT_CRD = _crd(
    "keda.sh",
    "v1alpha1",
    {
        "kind": "ScaledObject",
        "plural": "scaledobjects",
        "singular": "scaledobject",
        "shortNames": ["so"],
    },
    {
        "scaleTargetRef": {
            **_kept(
                {
                    "name": {"type": "string"},
                    "kind": {"type": "string"},
                    "apiVersion": {"type": "string"},
                }
            ),
            "required": ["name"],
        },
        "minReplicaCount": COUNT,
        "maxReplicaCount": COUNT,
        "triggers": {"type": "array", "items": ANY_OBJECT},
    },
)

STRUCTURAL_CRDS = (*WORKLOAD_CRDS, KEDA_SCALED_OBJECT_CRD)


def install_crds(api_client: Any, *, timeout: float = 60.0) -> None:
    """Create the CRDs (an existing one is left as it is) and wait until they are served."""
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    extensions = client.ApiextensionsV1Api(api_client)
    for crd in STRUCTURAL_CRDS:
        try:
            body: Any = crd  # the client accepts the manifest as a dict
            extensions.create_custom_resource_definition(body)
        except ApiException as error:
            if error.status != 409:
                raise
    deadline = time.monotonic() + timeout
    for crd in STRUCTURAL_CRDS:
        name = crd["metadata"]["name"]
        while True:
            status = extensions.read_custom_resource_definition(name).status
            conditions = (status.conditions if status is not None else None) or []
            if any(c.type == "Established" and c.status == "True" for c in conditions):
                break
            if time.monotonic() > deadline:
                raise TimeoutError(f"CRD {name} not established within {timeout:.0f}s")
            time.sleep(0.05)
