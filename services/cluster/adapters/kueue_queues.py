"""Kueue's ClusterQueues and Workloads as the quota lender reads and writes them (blocking HTTP
through KubeHttp; the decisions are cluster/core/kueue_quota.py's).

Bad input never raises past this module untyped: a missing Kueue CRD, another API version, a
ClusterQueue without the flavor its label names or without the resource, all raise
`KueueQuotaError` whose message names the object and the field.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from kubernetes.client.exceptions import ApiException

from tideshift.services.cluster.adapters.http import MERGE_PATCH, JsonObject, KubeHttp
from tideshift.services.cluster.core.conversions import parse_quantity
from tideshift.services.cluster.core.kueue_quota import (
    DEACTIVATED_ANNOTATION,
    LEND_QUOTA_LABEL,
    RESOURCES,
    Admitted,
    Amount,
    quantity,
)

KUEUE_API = "/apis/kueue.x-k8s.io/v1beta2"
CLUSTERQUEUES = f"{KUEUE_API}/clusterqueues"
WORKLOADS = f"{KUEUE_API}/workloads"


class KueueQuotaError(RuntimeError):
    """The quota cannot be read or written; the message says which object and field."""


@dataclass(frozen=True, slots=True)
class LentQueue:
    name: str
    flavor: str
    quota: Amount  # the flavor's nominalQuota as read (resources it does not cover: 0)
    covered: tuple[str, ...]  # of RESOURCES, those the flavor has a quota for
    resource_version: str
    obj: JsonObject


def _amount(resources: dict[str, Any]) -> Amount:
    def value(name: str) -> float:
        raw = resources.get(name)
        return float(parse_quantity(str(raw))) if raw is not None else 0.0

    return Amount(value("cpu"), value("memory"), value("nvidia.com/gpu"))


def _list(http: KubeHttp, path: str, what: str, query: Sequence[tuple[str, str]] = ()) -> Any:
    try:
        return http.get(path, query=query)
    except ApiException as error:
        if error.status == 404:
            raise KueueQuotaError(
                f"{what}: {path} is not served (Kueue missing, or not kueue.x-k8s.io/v1beta2, "
                "which Kueue v0.17 serves)"
            ) from error
        raise KueueQuotaError(f"{what}: {error.status} {error.reason}") from error


def _flavor_resources(obj: JsonObject, flavor: str) -> list[dict[str, Any]]:
    name = (obj.get("metadata") or {}).get("name")
    for group in (obj.get("spec") or {}).get("resourceGroups") or []:
        for item in group.get("flavors") or []:
            if item.get("name") == flavor:
                resources = item.get("resources")
                if not isinstance(resources, list):
                    break
                return resources
    raise KueueQuotaError(
        f"ClusterQueue {name}: label {LEND_QUOTA_LABEL}={flavor!r} names no flavor in "
        "spec.resourceGroups[].flavors[] (expected the ResourceFlavor whose quota to lend)"
    )


def read_queue(obj: JsonObject) -> LentQueue:
    """A labelled ClusterQueue as the lender sees it; KueueQuotaError when it cannot be lent."""
    metadata = obj.get("metadata") or {}
    name = str(metadata.get("name", ""))
    flavor = str((metadata.get("labels") or {}).get(LEND_QUOTA_LABEL) or "")
    if not flavor:
        raise KueueQuotaError(
            f"ClusterQueue {name}: label {LEND_QUOTA_LABEL} is empty (expected a flavor name)"
        )
    resources = _flavor_resources(obj, flavor)
    quotas = {str(r.get("name")): r.get("nominalQuota") for r in resources}
    covered = tuple(r for r in RESOURCES if r in quotas)
    if "cpu" not in covered:
        raise KueueQuotaError(
            f"ClusterQueue {name}: flavor {flavor!r} has no cpu in its resources "
            "(expected cpu, and memory or nvidia.com/gpu as the queue covers them)"
        )
    try:
        amount = _amount({k: v for k, v in quotas.items() if v is not None})
    except ValueError as error:
        raise KueueQuotaError(f"ClusterQueue {name}: flavor {flavor!r}: {error}") from error
    return LentQueue(name, flavor, amount, covered, str(metadata.get("resourceVersion", "")), obj)


def lent_queues(http: KubeHttp) -> tuple[list[LentQueue], list[str]]:
    """The ClusterQueues with the lend label, and an error message for each that cannot be
    lent (they are left as they are)."""
    listed = _list(
        http, CLUSTERQUEUES, "listing ClusterQueues", query=[("labelSelector", LEND_QUOTA_LABEL)]
    )
    queues, errors = [], []
    for obj in listed.get("items") or []:
        try:
            queues.append(read_queue(obj))
        except KueueQuotaError as error:
            errors.append(str(error))
    return queues, errors


def write_quota(http: KubeHttp, queue: LentQueue, quota: Amount, *, attempts: int = 3) -> None:
    """The flavor's nominalQuota of each covered resource set to `quota`, as a compare-and-set
    on the version read (a concurrent edit answers 409: read again and retried, `attempts`
    in all)."""
    obj: JsonObject = {**queue.obj}
    spec = {**(obj.get("spec") or {})}
    values = quota.by_name()
    groups = []
    for group in spec.get("resourceGroups") or []:
        flavors = []
        for flavor in group.get("flavors") or []:
            if flavor.get("name") != queue.flavor:
                flavors.append(flavor)
                continue
            resources = [
                {**r, "nominalQuota": quantity(str(r["name"]), values[str(r["name"])])}
                if r.get("name") in values
                else r
                for r in flavor.get("resources") or []
            ]
            flavors.append({**flavor, "resources": resources})
        groups.append({**group, "flavors": flavors})
    spec["resourceGroups"] = groups
    metadata = {**(obj.get("metadata") or {}), "resourceVersion": queue.resource_version}
    try:
        http.json(
            "PUT", f"{CLUSTERQUEUES}/{queue.name}", body={**obj, "spec": spec, "metadata": metadata}
        )
    except ApiException as error:
        if error.status == 409 and attempts > 1:
            # Kueue changed it meanwhile (its finalizer, its status): the quota is derived,
            # not merged, so it is written again over the version read now.
            fresh = read_queue(http.get(f"{CLUSTERQUEUES}/{queue.name}"))
            write_quota(http, fresh, quota, attempts=attempts - 1)
            return
        raise KueueQuotaError(
            f"ClusterQueue {queue.name}: writing nominalQuota failed: {error.status} "
            f"{error.reason}: {(error.body or '')[:300]}"
        ) from error


def _condition(obj: JsonObject, kind: str) -> dict[str, Any] | None:
    for item in (obj.get("status") or {}).get("conditions") or []:
        if item.get("type") == kind:
            return dict(item)
    return None


def _seconds(stamp: Any) -> float:
    try:
        return datetime.fromisoformat(str(stamp).replace("Z", "+00:00")).timestamp()
    except ValueError:
        return 0.0


def admitted_workloads(http: KubeHttp, queue: str) -> list[tuple[str, Admitted]]:
    """(namespace, workload) for those the queue holds quota for, and those Tideshift
    deactivated from it; a workload that cannot be read is left out."""
    items = _list(http, WORKLOADS, "listing Workloads").get("items") or []
    found = []
    for obj in items:
        metadata = obj.get("metadata") or {}
        annotations = metadata.get("annotations") or {}
        ours = annotations.get(DEACTIVATED_ANNOTATION) == queue
        admission = (obj.get("status") or {}).get("admission") or {}
        reserved = _condition(obj, "QuotaReserved")
        holding = admission.get("clusterQueue") == queue and (reserved or {}).get("status") == (
            "True"
        )
        finished = (_condition(obj, "Finished") or {}).get("status") == "True"
        if finished or not (holding or ours):
            continue
        try:
            usage = sum(
                (_amount(p.get("resourceUsage") or {}) for p in admission.get("podSetAssignments")
                 or []),
                Amount(),
            )  # fmt: skip
            if ours and not holding:
                usage = _template_usage(obj)
        except (ValueError, TypeError, AttributeError):
            continue
        since = _seconds((reserved or {}).get("lastTransitionTime") or metadata.get(
            "creationTimestamp"))  # fmt: skip
        priority = int((obj.get("spec") or {}).get("priority") or 0)
        found.append(
            (
                str(metadata.get("namespace")),
                Admitted(
                    str(metadata.get("name")),
                    priority,
                    since,
                    usage,
                    deactivated_by_us=ours and (obj.get("spec") or {}).get("active") is False,
                ),
            )
        )
    return found


def _template_usage(obj: JsonObject) -> Amount:
    """What a workload asks for: each pod set's count times its template's requests."""
    total = Amount()
    for pod_set in (obj.get("spec") or {}).get("podSets") or []:
        count = int(pod_set.get("count") or 0)
        for container in ((pod_set.get("template") or {}).get("spec") or {}).get(
            "containers"
        ) or []:
            requests = (container.get("resources") or {}).get("requests") or {}
            total = total + _amount(requests).scaled(count)
    return total


def set_active(http: KubeHttp, namespace: str, name: str, *, active: bool, queue: str) -> None:
    """Deactivate (Kueue evicts it) or reactivate (Kueue queues it again) a Workload, marking
    the ones Tideshift deactivated so that only those are ever reactivated."""
    annotation = None if active else queue
    patch = {
        "metadata": {"annotations": {DEACTIVATED_ANNOTATION: annotation}},
        "spec": {"active": active},
    }
    try:
        http.json(
            "PATCH",
            f"{KUEUE_API}/namespaces/{namespace}/workloads/{name}",
            body=patch,
            content_type=MERGE_PATCH,
        )
    except ApiException as error:
        raise KueueQuotaError(
            f"Workload {namespace}/{name}: setting spec.active={active} failed: "
            f"{error.status} {error.reason}"
        ) from error


def evictions(obj: JsonObject) -> int:
    """How many times Kueue evicted this Workload (status.schedulingStats.evictions)."""
    stats = (obj.get("status") or {}).get("schedulingStats") or {}
    return sum(int(item.get("count") or 0) for item in stats.get("evictions") or [])


def record_queue_event(http: KubeHttp, queue: str, *, reason: str, message: str) -> None:
    """A Warning Event on the ClusterQueue (cluster-scoped: its Events live in `default`)."""
    stamp = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    body = {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"generateName": f"{queue}.", "namespace": "default"},
        "involvedObject": {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ClusterQueue",
                           "name": queue},
        "reason": reason,
        "message": message[:1000],
        "type": "Warning",
        "source": {"component": "tideshift-executor"},
        "firstTimestamp": stamp,
        "lastTimestamp": stamp,
        "count": 1,
    }  # fmt: skip
    try:
        http.json("POST", "/api/v1/namespaces/default/events", body=body)
    except (ApiException, OSError) as error:
        raise KueueQuotaError(f"cannot record an event on ClusterQueue {queue}: {error}") from error
