"""The API version Tideshift talks for each group-qualified kind, and the kind names an
operator may type. The identity itself (`Kind.group/namespace/name`) is `events.WorkloadRef`.
"""

from __future__ import annotations

VOLCANO_JOB = "Job.batch.volcano.sh"
PYTORCH_JOB = "PyTorchJob.kubeflow.org"
RAY_CLUSTER = "RayCluster.ray.io"

# The served version used for each group-qualified kind Tideshift reads or scales.
API_VERSION: dict[str, str] = {
    "Deployment.apps": "apps/v1",
    "StatefulSet.apps": "apps/v1",
    "Job.batch": "batch/v1",
    VOLCANO_JOB: "batch.volcano.sh/v1alpha1",
    PYTORCH_JOB: "kubeflow.org/v1",
    RAY_CLUSTER: "ray.io/v1",
}

# Kinds a service's role may not grant (a role from before Tideshift scaled them): a 403 on
# listing them is read like a 404, the kind is not watched, instead of failing the listing.
MAY_BE_UNGRANTED: frozenset[str] = frozenset({RAY_CLUSTER})


def unwatchable(status: int | None, kind: str) -> bool:
    """Whether listing `kind` failed because there is nothing here to watch: the cluster does
    not serve it (404), or the role does not grant a kind it may lack (403)."""
    return status == 404 or (status == 403 and kind in MAY_BE_UNGRANTED)


# Names accepted on the command line (case-insensitive), kubectl's short names included.
ALIASES: dict[str, str] = {
    "deployment": "Deployment.apps",
    "deployments": "Deployment.apps",
    "deploy": "Deployment.apps",
    "deployment.apps": "Deployment.apps",
    "statefulset": "StatefulSet.apps",
    "statefulsets": "StatefulSet.apps",
    "sts": "StatefulSet.apps",
    "statefulset.apps": "StatefulSet.apps",
    "job": "Job.batch",
    "jobs": "Job.batch",
    "job.batch": "Job.batch",
    "pytorchjob": PYTORCH_JOB,
    "pytorchjobs": PYTORCH_JOB,
    "pytorchjob.kubeflow.org": PYTORCH_JOB,
    "raycluster": RAY_CLUSTER,
    "rayclusters": RAY_CLUSTER,
    "raycluster.ray.io": RAY_CLUSTER,
    "vcjob": VOLCANO_JOB,
    "vcjobs": VOLCANO_JOB,
    "vj": VOLCANO_JOB,
    "job.batch.volcano.sh": VOLCANO_JOB,
    "jobs.batch.volcano.sh": VOLCANO_JOB,
}


def qualified_kind(kind: str, api_version: str) -> str:
    """`Job` at `batch.volcano.sh/v1alpha1` -> `Job.batch.volcano.sh`; core kinds stay bare."""
    group = api_version.rsplit("/", 1)[0] if "/" in api_version else ""
    return f"{kind}.{group}" if group else kind


def normalise_kind(text: str) -> str | None:
    """A command-line kind (`deploy`, `vcjob`, `Job.batch.volcano.sh`) or None if unknown."""
    return ALIASES.get(text.strip().lower())
