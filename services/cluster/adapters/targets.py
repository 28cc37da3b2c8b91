"""One adapter per scalable kind: where its replica count lives and which bounds it carries.

Each adapter has two pure methods on the object as read from the apiserver (a dict):
`observe` (current replicas, ready replicas, min/max) and `scaled` (the write that sets a
new count), plus `read`/`write` that do the blocking HTTP through `KubeHttp`. Every write
carries the resourceVersion that was read, so a concurrent change makes the apiserver answer
409 Conflict instead of one writer silently overwriting the other.

Bounds: a target's own limits (PyTorchJob `elasticPolicy`, Volcano gang minimums) combined
with the annotations `tideshift.io/min-replicas` and `tideshift.io/max-replicas` on the
target object; the stricter of the two wins.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace
from typing import Any, ClassVar

from tideshift.services.cluster.adapters.http import MERGE_PATCH, JsonObject, KubeHttp
from tideshift.services.cluster.core.engines import (
    kueue_hold,
    kueue_size_owner,
    workers_to_delete,
)
from tideshift.services.cluster.core.kinds import PYTORCH_JOB, RAY_CLUSTER, VOLCANO_JOB
from tideshift.services.cluster.port import ROLE_LABEL, ScaleState, UnsupportedTarget, WorkloadRef

log = logging.getLogger("tideshift.cluster.adapters")

MIN_REPLICAS_ANNOTATION = "tideshift.io/min-replicas"
MAX_REPLICAS_ANNOTATION = "tideshift.io/max-replicas"
SCALE_TASK_ANNOTATION = "tideshift.io/scale-task"  # Volcano: which task's replicas to scale
SCALE_GROUP_ANNOTATION = "tideshift.io/scale-group"  # RayCluster: which worker group to scale
DEFAULT_VOLCANO_TASK = "worker"


@dataclass(frozen=True)
class Observed:
    """A target as read: its scale state, the version read, and the raw object."""

    state: ScaleState
    resource_version: str
    obj: JsonObject


def _int_or_none(value: Any) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise ValueError(f"expected an integer, got {value!r}")
    return int(value)


def annotation_bounds(obj: JsonObject) -> tuple[int, int | None]:
    """(min, max) from the bound annotations; an unreadable annotation is ignored and logged."""
    annotations = (obj.get("metadata") or {}).get("annotations") or {}
    bounds: list[int | None] = []
    for key in (MIN_REPLICAS_ANNOTATION, MAX_REPLICAS_ANNOTATION):
        raw = annotations.get(key)
        try:
            value = _int_or_none(raw)
            if value is not None and value < 0:
                raise ValueError("must be >= 0")
        except ValueError as error:
            log.warning("ignoring annotation %s=%r: %s", key, raw, error)
            value = None
        bounds.append(value)
    return bounds[0] or 0, bounds[1]


def combine_bounds(own_min: int, own_max: int | None, obj: JsonObject) -> tuple[int, int | None]:
    """The stricter of the target's own bounds and its annotations."""
    annotated_min, annotated_max = annotation_bounds(obj)
    low = max(own_min, annotated_min)
    maxima = [value for value in (own_max, annotated_max) if value is not None]
    high = min(maxima) if maxima else None
    if high is not None and high < low:
        # Contradictory bounds: keep the target where its own rules put it, never below min.
        high = low
    return low, high


class TargetAdapter:
    """Base: reads the object at `path`, writes `scaled(...)` as a JSON merge patch."""

    kind: ClassVar[str]
    api_prefix: ClassVar[str]  # e.g. /apis/apps/v1
    plural: ClassVar[str]

    def path(self, target: WorkloadRef) -> str:
        return f"{self.api_prefix}/namespaces/{target.namespace}/{self.plural}/{target.name}"

    def observe(self, target: WorkloadRef, obj: JsonObject) -> ScaleState:
        raise NotImplementedError

    def scaled(self, obj: JsonObject, replicas: int) -> JsonObject:
        """The merge patch (without resourceVersion) that sets `replicas`."""
        raise NotImplementedError

    def pod_spec(self, obj: JsonObject) -> JsonObject:
        """The pod spec of one scaled replica (its template); companions excluded."""
        return ((obj.get("spec") or {}).get("template") or {}).get("spec") or {}

    def collection(self, namespace: str | None) -> str:
        """The path to list and watch this kind, in one namespace or all."""
        where = f"/namespaces/{namespace}" if namespace else ""
        return f"{self.api_prefix}{where}/{self.plural}"

    def read(self, http: KubeHttp, target: WorkloadRef) -> Observed:
        obj = http.get(self.path(target))
        hold = kueue_hold(obj) or kueue_size_owner(self.kind, obj)
        if hold is not None:
            raise UnsupportedTarget(hold)
        metadata = obj.get("metadata") or {}
        role = (metadata.get("labels") or {}).get(ROLE_LABEL)
        state = replace(self.observe(target, obj), role=role if isinstance(role, str) else None)
        return Observed(state, str(metadata.get("resourceVersion", "")), obj)

    def write(self, http: KubeHttp, target: WorkloadRef, observed: Observed, replicas: int) -> None:
        patch = self.scaled(observed.obj, replicas)
        patch["metadata"] = {"resourceVersion": observed.resource_version}
        http.json("PATCH", self.path(target), body=patch, content_type=MERGE_PATCH)


class ScaleSubresourceAdapter(TargetAdapter):
    """Deployment and StatefulSet: replicas written through the `/scale` subresource."""

    api_prefix = "/apis/apps/v1"

    def observe(self, target: WorkloadRef, obj: JsonObject) -> ScaleState:
        spec = obj.get("spec") or {}
        status = obj.get("status") or {}
        low, high = combine_bounds(0, None, obj)
        return ScaleState(
            target=target,
            replicas=int(spec.get("replicas", 1)),
            ready_replicas=int(status.get("readyReplicas") or 0),
            min_replicas=low,
            max_replicas=high,
        )

    def scaled(self, obj: JsonObject, replicas: int) -> JsonObject:
        return {"spec": {"replicas": replicas}}

    def write(self, http: KubeHttp, target: WorkloadRef, observed: Observed, replicas: int) -> None:
        # The Scale object shares the parent's resourceVersion: a PUT with it is a
        # compare-and-set, and RBAC only needs `update` on `<plural>/scale`.
        body = {
            "apiVersion": "autoscaling/v1",
            "kind": "Scale",
            "metadata": {
                "name": target.name,
                "namespace": target.namespace,
                "resourceVersion": observed.resource_version,
            },
            "spec": {"replicas": replicas},
        }
        http.json("PUT", self.path(target) + "/scale", body=body)


class DeploymentAdapter(ScaleSubresourceAdapter):
    kind = "Deployment.apps"
    plural = "deployments"


class StatefulSetAdapter(ScaleSubresourceAdapter):
    kind = "StatefulSet.apps"
    plural = "statefulsets"


class BatchJobAdapter(TargetAdapter):
    """batch/v1 Job: the number of pods running at once is `spec.parallelism`."""

    kind = "Job.batch"
    api_prefix = "/apis/batch/v1"
    plural = "jobs"

    def observe(self, target: WorkloadRef, obj: JsonObject) -> ScaleState:
        spec = obj.get("spec") or {}
        status = obj.get("status") or {}
        low, high = combine_bounds(0, None, obj)
        ready = status.get("ready")
        return ScaleState(
            target=target,
            replicas=int(spec.get("parallelism", 1)),
            ready_replicas=int(ready if ready is not None else status.get("active") or 0),
            min_replicas=low,
            max_replicas=high,
        )

    def scaled(self, obj: JsonObject, replicas: int) -> JsonObject:
        return {"spec": {"parallelism": replicas}}


def named_index(
    obj: JsonObject,
    names: list[str],
    annotation: str,
    *,
    noun: tuple[str, str],
    owner: str,
    default: str | None = None,
) -> int:
    """Which of an object's parts (Volcano tasks, KubeRay worker groups) to scale: the one
    `annotation` names, else `default`, else the only one. `noun` is the part's name
    (singular, plural) in the errors."""
    wanted = ((obj.get("metadata") or {}).get("annotations") or {}).get(annotation)
    if wanted is not None:
        if wanted not in names:
            raise UnsupportedTarget(
                f"{annotation}={wanted!r} names no {noun[0]} ({noun[1]}: {names})"
            )
        return names.index(wanted)
    if default is not None and default in names:
        return names.index(default)
    if len(names) == 1:
        return 0
    raise UnsupportedTarget(
        f"{owner} has {noun[1]} {names}: name the one to scale with {annotation}"
    )


class VolcanoJobAdapter(TargetAdapter):
    """Volcano `batch.volcano.sh/v1alpha1` Job: one task's `replicas`.

    The task is named by the annotation `tideshift.io/scale-task`, else the task called
    `worker`, else the only task. Gang minimums stay valid: the task never goes below its own
    `minAvailable`, nor below what the job's `minAvailable` needs from it after the other
    tasks' replicas are counted.
    """

    kind = VOLCANO_JOB
    api_prefix = "/apis/batch.volcano.sh/v1alpha1"
    plural = "jobs"

    @staticmethod
    def task_index(obj: JsonObject) -> int:
        tasks = (obj.get("spec") or {}).get("tasks") or []
        names = [str(task.get("name", "")) for task in tasks]
        return named_index(
            obj,
            names,
            SCALE_TASK_ANNOTATION,
            noun=("task", "tasks"),
            owner="Volcano job",
            default=DEFAULT_VOLCANO_TASK,
        )

    def observe(self, target: WorkloadRef, obj: JsonObject) -> ScaleState:
        spec = obj.get("spec") or {}
        tasks = spec.get("tasks") or []
        index = self.task_index(obj)
        task = tasks[index]
        replicas = int(task.get("replicas", 1))
        others = sum(int(other.get("replicas", 1)) for i, other in enumerate(tasks) if i != index)
        job_min = int(spec.get("minAvailable") or 0)
        task_min = int(task.get("minAvailable") or 0)
        low, high = combine_bounds(max(task_min, job_min - others, 0), None, obj)
        status = obj.get("status") or {}
        counts = ((status.get("taskStatusCount") or {}).get(task.get("name")) or {}).get(
            "phase"
        ) or {}
        ready = counts.get("Running", status.get("running") or 0)
        return ScaleState(
            target=target,
            replicas=replicas,
            ready_replicas=int(ready),
            min_replicas=low,
            max_replicas=high,
        )

    def pod_spec(self, obj: JsonObject) -> JsonObject:
        task = ((obj.get("spec") or {}).get("tasks") or [])[self.task_index(obj)]
        return (task.get("template") or {}).get("spec") or {}

    def scaled(self, obj: JsonObject, replicas: int) -> JsonObject:
        # A merge patch replaces lists whole: send every task, with this one's count changed.
        tasks = [dict(task) for task in (obj.get("spec") or {}).get("tasks") or []]
        tasks[self.task_index(obj)]["replicas"] = replicas
        return {"spec": {"tasks": tasks}}


class PyTorchJobAdapter(TargetAdapter):
    """Kubeflow `kubeflow.org/v1` PyTorchJob: Worker `replicas` inside `elasticPolicy`.

    A PyTorchJob without `elasticPolicy` has a fixed world size: it is not scaled.
    """

    kind = PYTORCH_JOB
    api_prefix = "/apis/kubeflow.org/v1"
    plural = "pytorchjobs"

    def observe(self, target: WorkloadRef, obj: JsonObject) -> ScaleState:
        spec = obj.get("spec") or {}
        worker = (spec.get("pytorchReplicaSpecs") or {}).get("Worker")
        if worker is None:
            raise UnsupportedTarget("PyTorchJob has no Worker replica spec")
        elastic = spec.get("elasticPolicy")
        if elastic is None:
            raise UnsupportedTarget("PyTorchJob has no elasticPolicy: its world size is fixed")
        own_min = int(elastic.get("minReplicas") or 0)
        own_max = _int_or_none(elastic.get("maxReplicas"))
        low, high = combine_bounds(own_min, own_max, obj)
        status = obj.get("status") or {}
        active = ((status.get("replicaStatuses") or {}).get("Worker") or {}).get("active")
        return ScaleState(
            target=target,
            replicas=int(worker.get("replicas", 1)),
            ready_replicas=int(active or 0),
            min_replicas=low,
            max_replicas=high,
        )

    def pod_spec(self, obj: JsonObject) -> JsonObject:
        worker = ((obj.get("spec") or {}).get("pytorchReplicaSpecs") or {}).get("Worker") or {}
        return (worker.get("template") or {}).get("spec") or {}

    def scaled(self, obj: JsonObject, replicas: int) -> JsonObject:
        return {"spec": {"pytorchReplicaSpecs": {"Worker": {"replicas": replicas}}}}


class RayClusterAdapter(TargetAdapter):
    """KubeRay `ray.io/v1` RayCluster: one worker group's `replicas` within its own
    `minReplicas`/`maxReplicas`.

    The group is named by the annotation `tideshift.io/scale-group`, else the only group.
    Shrinking, Tideshift names the workers that go (`scaleStrategy.workersToDelete`): those
    not running first, then the youngest; KubeRay deletes exactly those.
    """

    kind = RAY_CLUSTER
    api_prefix = "/apis/ray.io/v1"
    plural = "rayclusters"

    @staticmethod
    def group_index(obj: JsonObject) -> int:
        groups = (obj.get("spec") or {}).get("workerGroupSpecs") or []
        names = [str(group.get("groupName", "")) for group in groups]
        return named_index(
            obj,
            names,
            SCALE_GROUP_ANNOTATION,
            noun=("worker group", "worker groups"),
            owner="RayCluster",
        )

    def _group(self, obj: JsonObject) -> JsonObject:
        group: JsonObject = ((obj.get("spec") or {}).get("workerGroupSpecs") or [])[
            self.group_index(obj)
        ]
        return group

    def observe(self, target: WorkloadRef, obj: JsonObject) -> ScaleState:
        group = self._group(obj)
        own_min = int(group.get("minReplicas") or 0)
        low, high = combine_bounds(own_min, _int_or_none(group.get("maxReplicas")), obj)
        name = group.get("groupName")
        statuses = (obj.get("status") or {}).get("workerGroupStatuses") or {}
        ready = (obj.get("status") or {}).get("readyWorkerReplicas")
        if isinstance(statuses, dict) and name in statuses:
            ready = (statuses[name] or {}).get("readyReplicas", ready)
        return ScaleState(
            target=target,
            replicas=int(group.get("replicas", 0)),
            ready_replicas=int(ready or 0),
            min_replicas=low,
            max_replicas=high,
        )

    def pod_spec(self, obj: JsonObject) -> JsonObject:
        return (self._group(obj).get("template") or {}).get("spec") or {}

    def scaled(self, obj: JsonObject, replicas: int) -> JsonObject:
        return self.scaled_deleting(obj, replicas, [])

    def scaled_deleting(self, obj: JsonObject, replicas: int, victims: list[str]) -> JsonObject:
        # A merge patch replaces lists whole: send every group, with this one changed.
        groups = [dict(group) for group in (obj.get("spec") or {}).get("workerGroupSpecs") or []]
        index = self.group_index(obj)
        groups[index]["replicas"] = replicas
        strategy = dict(groups[index].get("scaleStrategy") or {})
        strategy["workersToDelete"] = victims
        groups[index]["scaleStrategy"] = strategy
        return {"spec": {"workerGroupSpecs": groups}}

    def write(self, http: KubeHttp, target: WorkloadRef, observed: Observed, replicas: int) -> None:
        victims: list[str] = []
        if replicas < observed.state.replicas:
            group = str(self._group(observed.obj).get("groupName", ""))
            selector = f"ray.io/cluster={target.name},ray.io/group={group}"
            listed = http.get(
                f"/api/v1/namespaces/{target.namespace}/pods", query=[("labelSelector", selector)]
            )
            live = [
                pod
                for pod in listed.get("items") or []
                if not (pod.get("metadata") or {}).get("deletionTimestamp")
            ]
            victims = workers_to_delete(live, replicas)
        patch = self.scaled_deleting(observed.obj, replicas, victims)
        patch["metadata"] = {"resourceVersion": observed.resource_version}
        http.json("PATCH", self.path(target), body=patch, content_type=MERGE_PATCH)


def default_adapters() -> dict[str, TargetAdapter]:
    """The registry: qualified kind -> adapter. Explicit, no import-time registration."""
    adapters: list[TargetAdapter] = [
        DeploymentAdapter(),
        StatefulSetAdapter(),
        BatchJobAdapter(),
        VolcanoJobAdapter(),
        PyTorchJobAdapter(),
        RayClusterAdapter(),
    ]
    return {adapter.kind: adapter for adapter in adapters}
