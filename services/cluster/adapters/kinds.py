"""How a scale target's kind is spelled in `TargetRef.kind`, in events and on the command line.

`TargetRef.kind` is the Kubernetes kind, qualified with its API group only when the group is
not the usual one for that kind: `Deployment`, `StatefulSet`, `Job` (batch/v1), `PyTorchJob`
(kubeflow.org/v1), but `Job.batch.volcano.sh` for a Volcano Job. Events carry the plain kind
plus `api_version` (`WorkloadRef`); these functions convert between the two spellings.
"""

from __future__ import annotations

from tideshift.events import WorkloadRef
from tideshift.services.cluster.port import TargetRef

# The group a kind belongs to when nothing else is said (kubectl's own defaults for these).
DEFAULT_GROUP: dict[str, str] = {
    "Deployment": "apps",
    "StatefulSet": "apps",
    "ReplicaSet": "apps",
    "DaemonSet": "apps",
    "Job": "batch",
    "CronJob": "batch",
    "PyTorchJob": "kubeflow.org",
}

# The served version used for each (kind, group) Tideshift talks to.
API_VERSION: dict[tuple[str, str], str] = {
    ("Deployment", "apps"): "apps/v1",
    ("StatefulSet", "apps"): "apps/v1",
    ("ReplicaSet", "apps"): "apps/v1",
    ("DaemonSet", "apps"): "apps/v1",
    ("Job", "batch"): "batch/v1",
    ("CronJob", "batch"): "batch/v1",
    ("Job", "batch.volcano.sh"): "batch.volcano.sh/v1alpha1",
    ("PyTorchJob", "kubeflow.org"): "kubeflow.org/v1",
}

VOLCANO_JOB = "Job.batch.volcano.sh"

# Names accepted on the command line (case-insensitive), kubectl's short names included.
ALIASES: dict[str, str] = {
    "deployment": "Deployment",
    "deployments": "Deployment",
    "deploy": "Deployment",
    "statefulset": "StatefulSet",
    "statefulsets": "StatefulSet",
    "sts": "StatefulSet",
    "job": "Job",
    "jobs": "Job",
    "job.batch": "Job",
    "pytorchjob": "PyTorchJob",
    "pytorchjobs": "PyTorchJob",
    "pytorchjob.kubeflow.org": "PyTorchJob",
    "vcjob": VOLCANO_JOB,
    "vcjobs": VOLCANO_JOB,
    "vj": VOLCANO_JOB,
    "job.batch.volcano.sh": VOLCANO_JOB,
    "jobs.batch.volcano.sh": VOLCANO_JOB,
}


def group_of(api_version: str) -> str:
    """`apps/v1` -> `apps`; the core group (`v1`) -> ``."""
    return api_version.rsplit("/", 1)[0] if "/" in api_version else ""


def qualified_kind(kind: str, api_version: str) -> str:
    """The `TargetRef.kind` spelling of a kind served at `api_version` (empty = default)."""
    group = group_of(api_version)
    if not api_version or group == DEFAULT_GROUP.get(kind, ""):
        return kind
    return f"{kind}.{group}"


def split_kind(qualified: str) -> tuple[str, str]:
    """`Job.batch.volcano.sh` -> (`Job`, `batch.volcano.sh/v1alpha1`); unknown groups get ``."""
    kind, _, group = qualified.partition(".")
    group = group or DEFAULT_GROUP.get(kind, "")
    return kind, API_VERSION.get((kind, group), "")


def normalise_kind(text: str) -> str | None:
    """A command-line kind (`deploy`, `vcjob`, `Job.batch.volcano.sh`) or None if unknown."""
    return ALIASES.get(text.strip().lower())


def to_target(ref: WorkloadRef) -> TargetRef:
    return TargetRef(
        namespace=ref.namespace, kind=qualified_kind(ref.kind, ref.api_version), name=ref.name
    )


def to_workload_ref(target: TargetRef) -> WorkloadRef:
    kind, api_version = split_kind(target.kind)
    return WorkloadRef(
        kind=kind, namespace=target.namespace, name=target.name, api_version=api_version
    )
