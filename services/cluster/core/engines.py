"""Rules for targets that another engine also drives: when Kueue owns a job's size, and which
KubeRay workers go when a worker group shrinks. Pure: objects in, decisions out.

Kueue v0.17 (checked in its module: pkg/workloadslicing, pkg/controller/jobs/job/job_webhook.go)
resizes an admitted job without evicting it only through *workload slices*: its feature gate
`ElasticJobsViaWorkloadSlices` (alpha, off by default) must be on and the job annotated
`kueue.x-k8s.io/elastic-job: "true"` when created (the annotation is immutable). The kinds that
opt in are batch/v1 Job, RayCluster, RayService and SparkApplication; a Kubeflow PyTorchJob
cannot. Any other admitted Kueue job whose size changes no longer matches its Workload, and
Kueue evicts it and queues it again whole: Tideshift leaves such a job's size to Kueue.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

KUEUE_QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
KUEUE_HOLD_PREFIX = "held by Kueue"
KUEUE_SIZE_PREFIX = "size left to Kueue"
# Opts a job into workload slices (Kueue's workloadslicing.EnabledAnnotationKey); Kueue's job
# webhook adds the scheduling gate of the same name to a batch/v1 Job's pod template only when
# the feature gate is on too, so the gate in the template proves both.
KUEUE_ELASTIC_ANNOTATION = "kueue.x-k8s.io/elastic-job"
KUEUE_ELASTIC_GATE = "kueue.x-k8s.io/elastic-job"
# Tideshift's kinds (`Kind.group`) that Kueue v0.17 can resize through workload slices.
KUEUE_SLICE_KINDS = ("Job.batch", "RayCluster.ray.io")


def _suspended(spec: Mapping[str, Any]) -> bool:
    """`spec.suspend` (batch/v1 Job) or `spec.runPolicy.suspend` (Kubeflow jobs)."""
    run_policy = spec.get("runPolicy") or {}
    return spec.get("suspend") is True or run_policy.get("suspend") is True


def kueue_hold(obj: Mapping[str, Any]) -> str | None:
    """Why Tideshift must leave this object's size alone, or None.

    A job with Kueue's queue label that is suspended has not been admitted (or was evicted):
    Kueue decides when it runs and with how many pods; a resize would change the workload
    Kueue is still to admit. Such a job is skipped with this reason, never scaled.
    """
    metadata = obj.get("metadata") or {}
    queue = (metadata.get("labels") or {}).get(KUEUE_QUEUE_LABEL)
    if not queue:
        return None
    if not _suspended(obj.get("spec") or {}):
        return None
    return (
        f"{KUEUE_HOLD_PREFIX}: queued in {queue!r} and suspended (not admitted); "
        "its size is Kueue's until it is admitted"
    )


def _elastic_in_kueue(kind: str, obj: Mapping[str, Any]) -> str | None:
    """None when Kueue resizes this admitted job through workload slices, else why not."""
    if kind not in KUEUE_SLICE_KINDS:
        return (
            f"Kueue v0.17 has no workload slices for {kind} (only "
            f"{', '.join(KUEUE_SLICE_KINDS)}): a resize would evict it"
        )
    annotations = (obj.get("metadata") or {}).get("annotations") or {}
    if annotations.get(KUEUE_ELASTIC_ANNOTATION) != "true":
        return (
            f'not annotated {KUEUE_ELASTIC_ANNOTATION}: "true" when created: '
            "a resize would evict it"
        )
    if kind == "Job.batch":
        template = ((obj.get("spec") or {}).get("template") or {}).get("spec") or {}
        gates = [gate.get("name") for gate in template.get("schedulingGates") or []]
        if KUEUE_ELASTIC_GATE not in gates:
            return (
                f"Kueue did not gate its pods with {KUEUE_ELASTIC_GATE} (its feature gate "
                "ElasticJobsViaWorkloadSlices is off): a resize would evict it"
            )
    return None


def kueue_size_owner(kind: str, obj: Mapping[str, Any]) -> str | None:
    """Why Kueue keeps this *admitted* job's size (Tideshift holds it where it is), or None.

    None for a job without Kueue's queue label, for one Kueue has not admitted (that is
    `kueue_hold`'s), and for one Kueue resizes through workload slices (see the module).
    """
    metadata = obj.get("metadata") or {}
    queue = (metadata.get("labels") or {}).get(KUEUE_QUEUE_LABEL)
    if not queue or _suspended(obj.get("spec") or {}):
        return None
    why = _elastic_in_kueue(kind, obj)
    if why is None:
        return None
    return f"{KUEUE_SIZE_PREFIX}: admitted through {queue!r}; {why}"


def workers_to_delete(pods: Sequence[Mapping[str, Any]], keep: int) -> list[str]:
    """The names of the pods to remove so that `keep` remain: those not running first (they
    hold no progress), then the youngest (the least work lost), ties by name."""
    excess = len(pods) - max(keep, 0)
    if excess <= 0:
        return []

    def name(pod: Mapping[str, Any]) -> str:
        return str((pod.get("metadata") or {}).get("name") or "")

    def created(pod: Mapping[str, Any]) -> str:
        # RFC 3339 in UTC: the string order is the time order.
        return str((pod.get("metadata") or {}).get("creationTimestamp") or "")

    def running(pod: Mapping[str, Any]) -> bool:
        return (pod.get("status") or {}).get("phase") == "Running"

    ranked = sorted(pods, key=name)
    ranked.sort(key=created, reverse=True)  # stable: the youngest first, ties by name
    ranked.sort(key=running)  # stable: those not running before those running
    return [name(pod) for pod in ranked[:excess]]
