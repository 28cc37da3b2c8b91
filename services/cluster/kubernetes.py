"""`ClusterPort` over a real Kubernetes apiserver, with the official `kubernetes` client.

Watching works like a client-go informer, one per resource (Nodes, Pods, and each supported
scale target kind, labelled `tideshift.io/role: serving|training` only), each in its own
thread because the client blocks:

* list (paged), remember the list's resourceVersion, then watch from it with bookmarks, so a
  reconnect resumes where the last event or bookmark left off and misses nothing;
* a 410 Gone (the apiserver no longer holds that version) or the periodic resync relists and
  emits only the real differences from what was already seen: added, deleted, and changed
  objects;
* an object whose conversion changes nothing Tideshift reads (a node heartbeat, a status
  timestamp) is not emitted at all;
* connection errors reconnect with exponential backoff; one bad object is logged, counted
  and skipped; the loop never exits until the watch is closed.

Pods are resolved to the workload that scales them: Pod -> ReplicaSet -> Deployment
(ReplicaSets are read once and cached), StatefulSet, batch/v1 Job, Volcano Job
(`batch.volcano.sh`), Kubeflow PyTorchJob; any other controller is reported as it is.

Labels and annotations read (on pods, set them in the pod template):

* `tideshift.io/role` (label, or annotation): `serving`, `training` or `other`. Without it,
  pods of PyTorchJobs and Volcano Jobs are `training`, everything else `other`.
* `tideshift.io/companion: "true"` (label): a fixed helper pod of a training job
  (a parameter server), not one of its elastic trainers.

On scale targets (see `tideshift.services.cluster.adapters.targets`): `tideshift.io/min-replicas`,
`tideshift.io/max-replicas`, and for Volcano Jobs `tideshift.io/scale-task`.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
import threading
import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable, Iterable, Mapping
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Generic, TypeVar, cast

import urllib3.exceptions
from kubernetes import config as kube_config
from kubernetes.client import ApiClient
from kubernetes.client.exceptions import ApiException
from kubernetes.utils import parse_quantity
from prometheus_client import Counter

from tideshift.services.cluster.adapters.http import JsonObject, KubeHttp, status_of
from tideshift.services.cluster.adapters.kinds import (
    API_VERSION,
    PYTORCH_JOB,
    VOLCANO_JOB,
    qualified_kind,
)
from tideshift.services.cluster.adapters.targets import Observed, TargetAdapter, default_adapters
from tideshift.services.cluster.overcommit import BATCH_CPU, BATCH_MEMORY
from tideshift.services.cluster.port import (
    ROLE_LABEL,
    ChangeType,
    ClusterChange,
    ClusterError,
    Node,
    Pod,
    PodPhase,
    Resources,
    Role,
    ScaleState,
    UnsupportedTarget,
    Workload,
    WorkloadRef,
)
from tideshift.services.common.retry import Backoff, exponential

log = logging.getLogger("tideshift.cluster.kubernetes")

GPU_RESOURCE = "nvidia.com/gpu"
TRAINING_KINDS = frozenset({PYTORCH_JOB, VOLCANO_JOB})
ROLES: frozenset[str] = frozenset({"serving", "training", "other"})
PHASES: frozenset[str] = frozenset({"Pending", "Running", "Succeeded", "Failed"})

SKIPPED = Counter(
    "tideshift_watch_objects_skipped_total", "Watched objects that could not be read", ["resource"]
)
RELISTS = Counter(
    "tideshift_watch_relists_total", "Full relists (start, 410 Gone, resync)", ["resource", "cause"]
)
WATCH_ERRORS = Counter(
    "tideshift_watch_errors_total", "Watch connections lost or refused", ["resource"]
)
OWNER_LOOKUP_FAILURES = Counter(
    "tideshift_watch_owner_lookup_failures_total", "ReplicaSet owner lookups that failed"
)
SCALE_CONFLICTS = Counter(
    "tideshift_scale_conflicts_total", "409 Conflicts on scale writes (re-read and retried)"
)

RECENT_READ_SECONDS = 2.0  # how long a get_scale read may stand in for set_scale's own read

# ---- conversions (pure) ------------------------------------------------------------------


def _quantity(value: Any) -> float:
    return float(parse_quantity(str(value)))  # type: ignore[no-untyped-call]


def resources_of(amounts: Mapping[str, Any] | None) -> Resources:
    amounts = amounts or {}
    return Resources(
        cpu=_quantity(amounts.get("cpu", 0)),
        memory=_quantity(amounts.get("memory", 0)),
        gpu=int(_quantity(amounts.get(GPU_RESOURCE, 0))),
    )


def pod_requests(spec: Mapping[str, Any]) -> Resources:
    """What the scheduler reserves: max(sum of containers, largest init container) + overhead."""
    containers = Resources()
    for container in spec.get("containers") or []:
        containers = containers + resources_of((container.get("resources") or {}).get("requests"))
    init_peak = Resources()
    sidecars = Resources()
    for container in spec.get("initContainers") or []:
        request = resources_of((container.get("resources") or {}).get("requests"))
        if container.get("restartPolicy") == "Always":
            sidecars = sidecars + request  # native sidecars run beside the containers
            continue
        init_peak = Resources(
            max(init_peak.cpu, request.cpu),
            max(init_peak.memory, request.memory),
            max(init_peak.gpu, request.gpu),
        )
    running = containers + sidecars
    total = Resources(
        max(running.cpu, init_peak.cpu),
        max(running.memory, init_peak.memory),
        max(running.gpu, init_peak.gpu),
    )
    return total + resources_of(spec.get("overhead"))


def pod_batch_requests(spec: Mapping[str, Any]) -> Resources:
    """What one pod borrows from serving's idle reservation: its containers' requests of
    tideshift.io/batch-cpu (millicores, returned as cores) and tideshift.io/batch-memory."""
    cpu = memory = 0.0
    for container in spec.get("containers") or []:
        amounts = (container.get("resources") or {}).get("requests") or {}
        cpu += _quantity(amounts.get(BATCH_CPU, 0)) / 1000.0
        memory += _quantity(amounts.get(BATCH_MEMORY, 0))
    return Resources(cpu=cpu, memory=memory)


def _timestamp(value: Any) -> float:
    if not value:
        return 0.0
    return datetime.fromisoformat(str(value).replace("Z", "+00:00")).timestamp()


def _condition(status: Mapping[str, Any], kind: str) -> bool:
    return any(
        condition.get("type") == kind and condition.get("status") == "True"
        for condition in status.get("conditions") or []
    )


def role_of(
    labels: Mapping[str, str], annotations: Mapping[str, str], owner: WorkloadRef | None
) -> Role:
    """The pod's role: label, then annotation `tideshift.io/role`, then the owner's kind."""
    for source in (labels, annotations):
        value = source.get(ROLE_LABEL)
        if value is None:
            continue
        if value in ROLES:
            return value  # type: ignore[return-value]
        log.warning("ignoring %s=%r: expected serving, training or other", ROLE_LABEL, value)
    if owner is not None and owner.kind in TRAINING_KINDS:
        return "training"
    return "other"


def node_from_object(obj: Mapping[str, Any]) -> Node:
    metadata = obj["metadata"]
    spec = obj.get("spec") or {}
    status = obj.get("status") or {}
    return Node(
        name=str(metadata["name"]),
        allocatable=resources_of(status.get("allocatable")),
        ready=_condition(status, "Ready"),
        unschedulable=bool(spec.get("unschedulable", False)),
        labels=tuple(sorted((metadata.get("labels") or {}).items())),
        resource_version=str(metadata.get("resourceVersion", "")),
    )


OwnerResolver = Callable[[str, Mapping[str, Any]], WorkloadRef | None]


def controller_reference(metadata: Mapping[str, Any]) -> Mapping[str, Any] | None:
    for reference in metadata.get("ownerReferences") or []:
        if reference.get("controller"):
            return dict(reference)
    return None


def direct_owner(namespace: str, reference: Mapping[str, Any]) -> WorkloadRef:
    """The controller itself, without following ReplicaSets to their Deployment."""
    return WorkloadRef(
        namespace=namespace,
        kind=qualified_kind(str(reference["kind"]), str(reference.get("apiVersion", ""))),
        name=str(reference["name"]),
    )


def pod_from_object(obj: Mapping[str, Any], resolve_owner: OwnerResolver) -> Pod:
    metadata = obj["metadata"]
    spec = obj.get("spec") or {}
    status = obj.get("status") or {}
    namespace = str(metadata["namespace"])
    labels: dict[str, str] = metadata.get("labels") or {}
    annotations: dict[str, str] = metadata.get("annotations") or {}
    reference = controller_reference(metadata)
    owner = resolve_owner(namespace, reference) if reference is not None else None
    raw_phase = status.get("phase") or "Pending"
    # "Unknown" (node lost contact) is not a state the planner can count on: treat as pending.
    phase = cast(PodPhase, raw_phase if raw_phase in PHASES else "Pending")
    return Pod(
        namespace=namespace,
        name=str(metadata["name"]),
        requests=pod_requests(spec),
        priority=int(spec.get("priority") or 0),
        owner=owner,
        role=role_of(labels, annotations, owner),
        phase=phase,
        node=spec.get("nodeName") or None,
        created_at=_timestamp(metadata.get("creationTimestamp")),
        ready=_condition(status, "Ready"),
        labels=tuple(sorted(labels.items())),
        uid=str(metadata.get("uid", "")),
        priority_class=spec.get("priorityClassName") or None,
        deleting=metadata.get("deletionTimestamp") is not None,
        resource_version=str(metadata.get("resourceVersion", "")),
    )


WORKLOAD_SELECTOR = f"{ROLE_LABEL} in (serving,training)"


def workload_from_object(adapter: TargetAdapter, obj: JsonObject) -> Workload:
    """A labelled scale target: its scale and bounds (the adapter's), one replica's requests."""
    metadata = obj["metadata"]
    labels: dict[str, str] = metadata.get("labels") or {}
    label = labels.get(ROLE_LABEL)
    if label not in ("serving", "training"):
        raise ValueError(f"label {ROLE_LABEL}={label!r}: expected serving or training")
    role: Role = "serving" if label == "serving" else "training"
    ref = WorkloadRef(str(metadata["namespace"]), adapter.kind, str(metadata["name"]))
    annotations = tuple(sorted((metadata.get("annotations") or {}).items()))
    uid, version = str(metadata.get("uid", "")), str(metadata.get("resourceVersion", ""))
    try:
        state = adapter.observe(ref, obj)
        pod_spec = adapter.pod_spec(obj)
        requests, batch_requests = pod_requests(pod_spec), pod_batch_requests(pod_spec)
    except UnsupportedTarget as error:  # its owner is told (the watcher's invalid policy)
        return Workload(
            ref=ref,
            role=role,
            replicas=0,
            ready_replicas=0,
            min_replicas=0,
            max_replicas=None,
            requests=Resources(),
            annotations=annotations,
            uid=uid,
            resource_version=version,
            unscalable=str(error),
        )
    return Workload(
        ref=ref,
        role=role,
        replicas=state.replicas,
        ready_replicas=state.ready_replicas,
        min_replicas=state.min_replicas,
        max_replicas=state.max_replicas,
        requests=requests,
        annotations=annotations,
        uid=uid,
        resource_version=version,
        batch_requests=batch_requests,
    )


Obj = TypeVar("Obj", Node, Pod, Workload)


def same_content(before: Node | Pod | Workload, after: Node | Pod | Workload) -> bool:
    """Equal in everything Tideshift reads (the resourceVersion alone does not count)."""
    return replace(before, resource_version="") == replace(after, resource_version="")


def diff(before: Mapping[str, Obj], after: Mapping[str, Obj]) -> list[ClusterChange]:
    """The changes that turn `before` into `after`, keyed alike; unchanged objects omitted."""
    changes: list[ClusterChange] = []
    for key, obj in after.items():
        old = before.get(key)
        if old is None:
            changes.append(ClusterChange("added", obj))
        elif not same_content(old, obj):
            changes.append(ClusterChange("modified", obj))
    changes.extend(ClusterChange("deleted", obj) for key, obj in before.items() if key not in after)
    return changes


# ---- informers ---------------------------------------------------------------------------


class ResourceExpired(Exception):
    """410 Gone: the apiserver no longer keeps history back to our resourceVersion."""


Emit = Callable[[ClusterChange], None]


@dataclass
class WatchTuning:
    resync_seconds: float = 300.0  # relist this often and emit differences (safety net)
    watch_timeout_seconds: int = 240  # server-side end of one watch request; then resume
    backoff_initial_seconds: float = 0.2
    backoff_max_seconds: float = 15.0
    page_size: int = 500

    @property
    def retry(self) -> Backoff:
        """Waits between failed list/watch attempts in a row."""
        return exponential(initial=self.backoff_initial_seconds, maximum=self.backoff_max_seconds)


class Informer(Generic[Obj]):
    """List+watch of one resource into a cache; owned by one thread once watching starts."""

    def __init__(
        self,
        http: KubeHttp,
        *,
        resource: str,
        path: str,
        convert: Callable[[JsonObject], Obj],
        key: Callable[[Obj], str],
        label_selector: str | None,
        tuning: WatchTuning,
    ) -> None:
        self.http = http
        self.resource = resource
        self.path = path
        self.convert: Callable[[JsonObject], Obj] = convert
        self.key: Callable[[Obj], str] = key
        self.label_selector = label_selector
        self.tuning = tuning
        self.cache: dict[str, Obj] = {}
        self.resource_version = ""
        # Whether the cache follows the server now: false until the first list and from a
        # failed list or watch until the next one succeeds (the service is not ready then).
        self.watching = False
        self._response: Any = None
        self._lock = threading.Lock()  # guards _response for interrupt()

    def _selector(self) -> list[tuple[str, str]]:
        return [("labelSelector", self.label_selector)] if self.label_selector else []

    def _convert(self, raw: JsonObject) -> Obj | None:
        try:
            converted: Obj = self.convert(raw)
            return converted
        except Exception as error:  # one unreadable object must never stop the watch
            SKIPPED.labels(self.resource).inc()
            name = (raw.get("metadata") or {}).get("name", "?") if isinstance(raw, dict) else "?"
            log.warning("skipping %s %s: %s", self.resource, name, error)
            return None

    def relist(self, cause: str) -> list[ClusterChange]:
        """Replace the cache with a fresh (paged) list; returns the differences."""
        RELISTS.labels(self.resource, cause).inc()
        fresh: dict[str, Obj] = {}
        continue_token = ""
        while True:
            query = [*self._selector(), ("limit", str(self.tuning.page_size))]
            if continue_token:
                query.append(("continue", continue_token))
            page = self.http.get(self.path, query=query)
            for raw in page.get("items") or []:
                obj = self._convert(raw)
                if obj is not None:
                    fresh[self.key(obj)] = obj
            metadata = page.get("metadata") or {}
            continue_token = metadata.get("continue") or ""
            if not continue_token:
                resource_version = str(metadata.get("resourceVersion", ""))
                break
        changes = diff(self.cache, fresh)
        self.cache = fresh
        self.resource_version = resource_version
        return changes

    def apply(self, change_type: str, raw: JsonObject) -> ClusterChange | None:
        """Fold one watch event into the cache; the change to emit, if any."""
        metadata = raw.get("metadata") or {}
        if metadata.get("resourceVersion"):
            self.resource_version = str(metadata["resourceVersion"])
        obj = self._convert(raw)
        if obj is None:
            return None
        key = self.key(obj)
        old = self.cache.get(key)
        if change_type == "DELETED":
            if self.cache.pop(key, None) is None:
                return None
            return ClusterChange("deleted", obj)
        self.cache[key] = obj
        if old is None:
            return ClusterChange("added", obj)
        if same_content(old, obj):
            return None
        kind: ChangeType = "modified"
        return ClusterChange(kind, obj)

    def watch_once(self, emit: Emit, stop: threading.Event, timeout_seconds: int) -> None:
        """One watch request from `resource_version` until the server ends it."""
        query = [
            *self._selector(),
            ("watch", "true"),
            ("resourceVersion", self.resource_version),
            ("allowWatchBookmarks", "true"),
            ("timeoutSeconds", str(timeout_seconds)),
        ]
        # Read timeout beyond the server's own end: a silent, half-dead connection is dropped.
        response = self.http.request(
            "GET", self.path, query=query, timeout=(5.0, timeout_seconds + 30.0)
        )
        with self._lock:
            self._response = response
        self.watching = True
        try:
            for line in self.http.lines(response):
                if stop.is_set():
                    return
                event = json.loads(line)
                event_type = event.get("type")
                raw = event.get("object") or {}
                if event_type == "ERROR":
                    if raw.get("code") == 410:
                        raise ResourceExpired(raw.get("message", "410 Gone"))
                    raise ApiException(status=raw.get("code"), reason=raw.get("message"))
                if event_type == "BOOKMARK":
                    version = (raw.get("metadata") or {}).get("resourceVersion")
                    if version:
                        self.resource_version = str(version)
                    continue
                change = self.apply(str(event_type), raw)
                if change is not None:
                    emit(change)
        finally:
            with self._lock:
                self._response = None
            with contextlib.suppress(Exception):
                response.release_conn()

    def interrupt(self) -> None:
        """Unblock a thread waiting on the watch stream (called from another thread)."""
        with self._lock:
            response = self._response
        if response is not None:
            with contextlib.suppress(Exception):
                response.shutdown()

    def run(self, emit: Emit, stop: threading.Event) -> None:
        """The informer loop: relist when needed, watch, reconnect; until `stop`.

        No exception ends it (a closed event loop only stops it through `stop`, which the
        port sets when its watch ends); `watching` says whether the cache follows the server.
        """
        try:
            self._run(emit, stop)
        finally:
            self.watching = False

    def _back_off(self, error: Exception, failures: int, stop: threading.Event) -> None:
        """Wait after a failed list or watch. A kind the cluster does not serve (404 before
        any list: no Volcano, no training operator) is said once and looked for again now and
        then; anything else is counted and logged each time."""
        self.watching = False
        if status_of(error) == 404 and not self.resource_version:
            if failures == 1:
                log.info("%s is not served by this cluster; checking again later", self.resource)
            stop.wait(self.tuning.backoff_max_seconds)
            return
        WATCH_ERRORS.labels(self.resource).inc()
        backoff = self.tuning.retry.delay(failures)
        log.warning(
            "%s watch failed (%s: %s); retrying in %.1fs",
            self.resource,
            type(error).__name__,
            str(error).splitlines()[0] if str(error) else "",
            backoff,
        )
        stop.wait(backoff)

    def _run(self, emit: Emit, stop: threading.Event) -> None:
        failures = 0
        next_resync = time.monotonic() + self.tuning.resync_seconds
        cause = "start" if not self.resource_version else ""
        while not stop.is_set():
            try:
                if time.monotonic() >= next_resync:
                    cause = "resync"
                if cause:
                    for change in self.relist(cause):
                        emit(change)
                    cause = ""
                    next_resync = time.monotonic() + self.tuning.resync_seconds
                remaining = int(next_resync - time.monotonic())
                timeout = max(1, min(self.tuning.watch_timeout_seconds, remaining))
                self.watch_once(emit, stop, timeout)
                failures = 0
            except ResourceExpired as error:
                log.info("%s watch expired (%s): relisting", self.resource, error)
                cause = "gone"
            except (
                ApiException,
                urllib3.exceptions.HTTPError,
                OSError,
                ValueError,
            ) as error:
                if stop.is_set():
                    return
                if status_of(error) == 410:
                    cause = "gone"
                    continue
                failures += 1
                self._back_off(error, failures, stop)
            except Exception:  # anything else, RecursionError included: list and watch again
                if stop.is_set():
                    return
                self.watching = False
                WATCH_ERRORS.labels(self.resource).inc()
                failures += 1
                log.exception("%s watch hit an unexpected error; retrying", self.resource)
                stop.wait(self.tuning.retry.delay(failures))


# ---- the port ----------------------------------------------------------------------------


class _OwnerCache:
    """ReplicaSet -> Deployment answers by ReplicaSet uid (owners of a ReplicaSet do not move)."""

    def __init__(self, http: KubeHttp, capacity: int = 8192) -> None:
        self.http = http
        self.capacity = capacity
        self._entries: OrderedDict[str, WorkloadRef] = OrderedDict()
        self._lock = threading.Lock()

    def resolve(self, namespace: str, reference: Mapping[str, Any]) -> WorkloadRef | None:
        if reference.get("kind") != "ReplicaSet":
            return direct_owner(namespace, reference)
        uid = str(reference.get("uid") or f"{namespace}/{reference.get('name')}")
        with self._lock:
            cached = self._entries.get(uid)
            if cached is not None:
                self._entries.move_to_end(uid)
                return cached
        name = str(reference["name"])
        try:
            replica_set = self.http.get(f"/apis/apps/v1/namespaces/{namespace}/replicasets/{name}")
        except (ApiException, urllib3.exceptions.HTTPError, OSError, ValueError) as error:
            OWNER_LOOKUP_FAILURES.inc()
            log.warning("cannot read ReplicaSet %s/%s: %s", namespace, name, error)
            return direct_owner(namespace, reference)  # not cached: try again next time
        parent = controller_reference(replica_set.get("metadata") or {})
        owner = (
            direct_owner(namespace, parent)
            if parent is not None
            else direct_owner(namespace, reference)
        )
        with self._lock:
            self._entries[uid] = owner
            if len(self._entries) > self.capacity:
                self._entries.popitem(last=False)
        return owner


def _pod_key(pod: Pod) -> str:
    return f"{pod.namespace}/{pod.name}"


def _node_key(node: Node) -> str:
    return node.name


def _workload_key(workload: Workload) -> str:
    return str(workload.ref)


class KubernetesClusterPort:
    """`ClusterPort` on a real cluster. Blocking client calls run in threads."""

    def __init__(
        self,
        api_client: ApiClient,
        *,
        namespace: str | None = None,
        label_selector: str | None = None,
        tuning: WatchTuning | None = None,
        adapters: Mapping[str, TargetAdapter] | None = None,
        conflict_retries: int = 5,
        before_write: Callable[[WorkloadRef, int], None] | None = None,
    ) -> None:
        self.api_client = api_client
        self.http = KubeHttp(api_client)
        self.tuning = tuning or WatchTuning()
        self.adapters = dict(adapters) if adapters is not None else default_adapters()
        self.conflict_retries = conflict_retries
        # Test seam: runs between the read and the write of a scale (to provoke a conflict).
        self.before_write = before_write
        self.owners = _OwnerCache(self.http)
        pods_path = f"/api/v1/namespaces/{namespace}/pods" if namespace else "/api/v1/pods"
        self.nodes = Informer[Node](
            self.http,
            resource="nodes",
            path="/api/v1/nodes",
            convert=node_from_object,
            key=_node_key,
            label_selector=None,
            tuning=self.tuning,
        )
        self.pods = Informer[Pod](
            self.http,
            resource="pods",
            path=pods_path,
            convert=lambda raw: pod_from_object(raw, self.owners.resolve),
            key=_pod_key,
            label_selector=label_selector,
            tuning=self.tuning,
        )
        # One informer per supported kind, over objects labelled with a role only.
        self.workloads = [
            Informer[Workload](
                self.http,
                resource=kind,
                path=adapter.collection(namespace),
                convert=functools.partial(workload_from_object, adapter),
                key=_workload_key,
                label_selector=WORKLOAD_SELECTOR,
                tuning=self.tuning,
            )
            for kind, adapter in self.adapters.items()
        ]
        self._watching = False
        self._recent_reads: dict[WorkloadRef, tuple[float, Observed]] = {}
        self._recent_lock = threading.Lock()

    @classmethod
    def from_kubeconfig(
        cls, kubeconfig: str | Path | None = None, *, context: str | None = None, **options: Any
    ) -> KubernetesClusterPort:
        """From a kubeconfig file, else `$KUBECONFIG`/`~/.kube/config`, else in-cluster."""
        if kubeconfig is None:
            try:
                kube_config.load_incluster_config()  # type: ignore[no-untyped-call]
                return cls(ApiClient(), **options)
            except kube_config.ConfigException:
                pass
        api_client = kube_config.new_client_from_config(  # type: ignore[no-untyped-call]
            config_file=str(kubeconfig) if kubeconfig else None, context=context
        )
        return cls(api_client, **options)

    async def close(self) -> None:
        await asyncio.to_thread(self.api_client.close)

    # -- listing and watching ------------------------------------------------------------

    async def list_nodes(self) -> list[Node]:
        if not self._watching:
            await asyncio.to_thread(self.nodes.relist, "list")
        return list(self.nodes.cache.values())

    async def list_pods(self) -> list[Pod]:
        if not self._watching:
            await asyncio.to_thread(self.pods.relist, "list")
        return list(self.pods.cache.values())

    def unwatched(self) -> list[str]:
        """Resources whose list+watch is down while this port is being watched."""
        if not self._watching:
            return []
        return [informer.resource for informer in (self.nodes, self.pods) if not informer.watching]

    def _list_workloads(self) -> list[Workload]:
        listed: list[Workload] = []
        for informer in self.workloads:
            try:
                informer.relist("list")
            except ApiException as error:
                if error.status != 404:
                    raise
                log.info("%s is not served by this cluster: not watched", informer.resource)
            listed.extend(informer.cache.values())
        return listed

    async def list_workloads(self) -> list[Workload]:
        if not self._watching:
            return await asyncio.to_thread(self._list_workloads)
        return [w for informer in self.workloads for w in informer.cache.values()]

    def _record_event(self, target: Workload, reason: str, message: str) -> None:
        now = datetime.now(UTC).isoformat().replace("+00:00", "Z")
        ref = target.ref
        body = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"generateName": f"{ref.name[:200]}.", "namespace": ref.namespace},
            "involvedObject": {
                "apiVersion": API_VERSION.get(ref.kind, ""),
                "kind": ref.plain_kind,
                "name": ref.name,
                "namespace": ref.namespace,
                "uid": target.uid,
                "resourceVersion": target.resource_version,
            },
            "reason": reason,
            "message": message[:1024],
            "type": "Warning",
            "source": {"component": "tideshift-watcher"},
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
        }
        try:
            self.http.json("POST", f"/api/v1/namespaces/{ref.namespace}/events", body=body)
        except (ApiException, urllib3.exceptions.HTTPError, OSError) as error:
            raise _classified(ref, "record an event on", error) from error

    async def record_event(self, target: Workload, *, reason: str, message: str) -> None:
        await asyncio.to_thread(self._record_event, target, reason, message)

    async def watch(self) -> AsyncIterator[ClusterChange]:
        if self._watching:
            raise RuntimeError("this port is already being watched")
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[ClusterChange] = asyncio.Queue()
        stop = threading.Event()

        def emit(change: ClusterChange) -> None:
            loop.call_soon_threadsafe(queue.put_nowait, change)

        self._watching = True
        informers: list[tuple[str, Informer[Any]]] = [
            ("nodes", self.nodes),
            ("pods", self.pods),
            *((informer.resource, informer) for informer in self.workloads),
        ]
        threads = [
            threading.Thread(
                target=informer.run,
                args=(emit, stop),
                name=f"watch-{name}",
                daemon=True,
            )
            for name, informer in informers
        ]
        for thread in threads:
            thread.start()
        try:
            while True:
                yield await queue.get()
        finally:
            stop.set()
            for _, informer in informers:
                informer.interrupt()
            await asyncio.to_thread(_join_all, threads, 5.0)
            self._watching = False

    # -- scale ---------------------------------------------------------------------------

    def _adapter(self, target: WorkloadRef) -> TargetAdapter:
        adapter = self.adapters.get(target.kind)
        if adapter is None:
            raise UnsupportedTarget(
                f"no scale adapter for kind {target.kind!r}; supported: {sorted(self.adapters)}"
            )
        return adapter

    def _read(self, target: WorkloadRef) -> Observed:
        adapter = self._adapter(target)
        try:
            observed = adapter.read(self.http, target)
        except (ApiException, urllib3.exceptions.HTTPError, OSError) as error:
            raise _classified(target, "read", error) from error
        with self._recent_lock:
            self._recent_reads[target] = (time.monotonic(), observed)
            if len(self._recent_reads) > 1024:
                self._recent_reads.pop(next(iter(self._recent_reads)))
        return observed

    def _recent_read(self, target: WorkloadRef) -> Observed | None:
        """The read made by a get_scale just before, if any: saves a round trip on set_scale.

        Safe because every write carries the version read: had the object changed since,
        the write gets 409 Conflict and the loop reads afresh.
        """
        with self._recent_lock:
            entry = self._recent_reads.pop(target, None)
        if entry is None or time.monotonic() - entry[0] > RECENT_READ_SECONDS:
            return None
        return entry[1]

    async def get_scale(self, target: WorkloadRef) -> ScaleState:
        return (await asyncio.to_thread(self._read, target)).state

    def _set_scale(self, target: WorkloadRef, replicas: int) -> ScaleState:
        adapter = self._adapter(target)
        recent = self._recent_read(target)
        for attempt in range(self.conflict_retries + 1):
            observed = recent if recent is not None and attempt == 0 else self._read(target)
            state = observed.state
            wanted = max(replicas, state.min_replicas)
            if state.max_replicas is not None:
                wanted = min(wanted, state.max_replicas)
            if wanted == state.replicas:
                return state
            if self.before_write is not None:
                self.before_write(target, attempt)
            try:
                adapter.write(self.http, target, observed, wanted)
            except (ApiException, urllib3.exceptions.HTTPError, OSError) as error:
                if status_of(error) == 409 and attempt < self.conflict_retries:
                    SCALE_CONFLICTS.inc()
                    log.info("conflict scaling %s; re-reading (attempt %d)", target, attempt + 1)
                    continue
                raise _classified(target, "write", error) from error
            return replace(state, replicas=wanted)
        raise AssertionError("unreachable")  # the loop returns or raises

    async def set_scale(self, target: WorkloadRef, replicas: int) -> ScaleState:
        return await asyncio.to_thread(self._set_scale, target, replicas)


# Answers after which another try later may succeed: conflict (after our own re-reads),
# throttled, or the apiserver (or what stands before it) failing.
TRANSIENT_STATUSES = frozenset({409, 429, 500, 502, 503, 504})


def _classified(target: WorkloadRef, what: str, error: BaseException) -> Exception:
    """The port's own error for a client error: KeyError (gone) or ClusterError."""
    status = status_of(error)
    if status == 404:
        return KeyError(f"{target} not found")
    reason = getattr(error, "reason", None) or type(error).__name__
    message = f"{what} {target}: " + (f"HTTP {status} {reason}" if status else str(reason))
    transient = status is None or status in TRANSIENT_STATUSES
    return ClusterError(message, transient=transient, status=status)


def _join_all(threads: Iterable[threading.Thread], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    for thread in threads:
        thread.join(max(0.0, deadline - time.monotonic()))
