"""Rules for targets that another engine also drives: when Kueue owns a job's size, and which
KubeRay workers go when a worker group shrinks. Pure: objects in, decisions out."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

KUEUE_QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
KUEUE_HOLD_PREFIX = "held by Kueue"


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
