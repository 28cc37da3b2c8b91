"""The Kubernetes cluster port: lists and watches through one informer per resource (Nodes,
Pods, and each supported scale target kind labelled `tideshift.io/role: serving|training`;
per namespace when limited to some, which is all a Role in each of them grants),
reads and writes a target's scale, and records events.

Decides how a scale write meets a conflict (re-read, bounded) and which client errors are
the port's own (`KeyError`, `ClusterError(transient=...)`); conversions are
`cluster.core.conversions`, the list+watch loop `cluster.informer`. Only this module and the
adapters talk to the apiserver; never the bus or a service.

Pods are resolved to the workload that scales them: Pod -> ReplicaSet -> Deployment
(ReplicaSets are read once and cached), StatefulSet, batch/v1 Job, Volcano Job
(`batch.volcano.sh`), Kubeflow PyTorchJob; any other controller is reported as it is.

On scale targets (see `tideshift.services.cluster.adapters.targets`): `tideshift.io/min-replicas`,
`tideshift.io/max-replicas`, for Volcano Jobs `tideshift.io/scale-task`, for KubeRay
RayClusters `tideshift.io/scale-group`. A job queued in Kueue and suspended (not admitted) is
never scaled: reads of it raise `UnsupportedTarget` with the reason (`cluster.core.engines`).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import threading
import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable, Iterable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import urllib3.exceptions
from kubernetes import config as kube_config
from kubernetes.client import ApiClient
from kubernetes.client.exceptions import ApiException
from prometheus_client import Counter

from tideshift.services.cluster.adapters.autoscalers import KubernetesAutoscalers
from tideshift.services.cluster.adapters.events import EventType, EventWriter
from tideshift.services.cluster.adapters.http import KubeHttp, message_of, status_of
from tideshift.services.cluster.adapters.packing import KubernetesPackingWriter
from tideshift.services.cluster.adapters.targets import Observed, TargetAdapter, default_adapters
from tideshift.services.cluster.core.conversions import (
    WORKLOAD_SELECTOR,
    Obj,
    node_from_object,
    pod_from_object,
    workload_from_object,
)
from tideshift.services.cluster.core.kinds import unwatchable
from tideshift.services.cluster.informer import (
    Informer,
    InformerGroup,
    OwnerCache,
    WatchTuning,
)
from tideshift.services.cluster.port import (
    ClusterChange,
    ClusterError,
    Node,
    Pod,
    ScaleState,
    UnsupportedTarget,
    Workload,
    WorkloadRef,
)

log = logging.getLogger("tideshift.cluster.kubernetes")

SCALE_CONFLICTS = Counter(
    "tideshift_scale_conflicts_total", "409 Conflicts on scale writes (re-read and retried)"
)

# Changes the informer threads have read but the watcher has not taken yet, past which they
# stop reading their streams: a burst waits in the apiserver (which ends a watch that falls
# too far behind, and the informer lists again) instead of in this process's memory.
WATCH_BUFFER = 4_096
RECENT_READ_SECONDS = 2.0  # how long a get_scale read may stand in for set_scale's own read


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
        namespace: str | Sequence[str] | None = None,
        label_selector: str | None = None,
        tuning: WatchTuning | None = None,
        adapters: Mapping[str, TargetAdapter] | None = None,
        conflict_retries: int = 5,
        before_write: Callable[[WorkloadRef, int], None] | None = None,
        event_component: str = "tideshift",
        follow: bool = False,
    ) -> None:
        self.api_client = api_client
        self.http = KubeHttp(api_client)
        self.tuning = tuning or WatchTuning()
        self.adapters = dict(adapters) if adapters is not None else default_adapters()
        self.conflict_retries = conflict_retries
        # Test seam: runs between the read and the write of a scale (to provoke a conflict).
        self.before_write = before_write
        self.owners = OwnerCache(self.http)
        # A namespace, several (one informer each), or None: the whole cluster.
        scopes: list[str | None] = (
            [namespace] if isinstance(namespace, str) else [*namespace] if namespace else [None]
        )
        self.nodes = Informer[Node](
            self.http,
            resource="nodes",
            path="/api/v1/nodes",
            convert=node_from_object,
            key=_node_key,
            label_selector=None,
            tuning=self.tuning,
        )
        self.pods = InformerGroup(
            [
                Informer[Pod](
                    self.http,
                    resource="pods",
                    path=f"/api/v1/namespaces/{scope}/pods" if scope else "/api/v1/pods",
                    convert=lambda raw: pod_from_object(raw, self.owners.resolve),
                    key=_pod_key,
                    label_selector=label_selector,
                    tuning=self.tuning,
                )
                for scope in scopes
            ]
        )
        self.workloads = self._workload_informers(scopes)
        self._scopes = scopes
        self._watching = False
        self._recent_reads: dict[WorkloadRef, tuple[float, Observed]] = {}
        self._recent_lock = threading.Lock()
        self._uids: OrderedDict[WorkloadRef, str] = OrderedDict()  # see _record_event
        self.events = EventWriter(self.http, component=event_component)
        # On for a service that lists nodes and pods often and never watches (the executor,
        # per scale-down): informers follow them after the first listing (see _listing).
        self.follow = follow
        self._following: dict[str, list[threading.Thread]] = {}
        self._stop_following = threading.Event()
        self._relisting = asyncio.Lock()

    def _workload_informers(self, scopes: list[str | None]) -> list[Informer[Workload]]:
        """One informer per supported kind (and namespace), over objects labelled with a role."""
        return [
            Informer[Workload](
                self.http,
                resource=kind,
                path=adapter.collection(scope),
                convert=functools.partial(workload_from_object, adapter),
                key=_workload_key,
                label_selector=WORKLOAD_SELECTOR,
                tuning=self.tuning,
            )
            for kind, adapter in self.adapters.items()
            for scope in scopes
        ]

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
        if self._following:
            self._stop_following.set()
            followed: list[Informer[Any]] = [self.nodes, *self.pods.members]
            for informer in followed:
                informer.interrupt()
            threads = [thread for group in self._following.values() for thread in group]
            await asyncio.to_thread(_join_all, threads, 5.0)
        await asyncio.to_thread(self.api_client.close)

    def packing_writer(self) -> KubernetesPackingWriter:
        """Deletion-cost and Node extended-resource writes on this port's cluster."""
        return KubernetesPackingWriter(self.http)

    def autoscalers(self) -> KubernetesAutoscalers:
        """The HPAs and KEDA ScaledObjects of this port's namespaces: listed, and steered."""
        return KubernetesAutoscalers(self.http, namespaces=self._scopes, adapters=self.adapters)

    # -- listing and watching ------------------------------------------------------------

    async def list_nodes(self) -> list[Node]:
        return await self._listing([self.nodes])

    async def list_pods(self) -> list[Pod]:
        return await self._listing(self.pods.members)

    async def _listing(self, informers: Sequence[Informer[Obj]]) -> list[Obj]:
        """These informers' objects as the cluster has them: from their caches while watched
        or followed; otherwise listed afresh, and followed from then on if the port follows.
        A followed informer whose watch is down (reconnecting, or not granted) is listed
        afresh without touching its cache, as if the port did not follow."""
        resource = informers[0].resource
        if self._watching or (
            resource in self._following and all(informer.watching for informer in informers)
        ):
            return _cached(informers)
        if resource in self._following:
            fetched = await asyncio.to_thread(_fetch_all, informers)
            return [obj for fresh in fetched for obj in fresh.values()]
        # One listing at a time writes the caches (and starts their followers once).
        async with self._relisting:
            if resource not in self._following:
                await asyncio.to_thread(_relist_all, informers)
                if self.follow:
                    stop = self._stop_following
                    self._following[resource] = [_started(i, stop) for i in informers]
                return _cached(informers)
        return await self._listing(informers)

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
                if not unwatchable(error.status, informer.resource):
                    raise
                log.info("%s is not served or granted here: not watched", informer.resource)
            listed.extend(informer.cache.values())
        return listed

    async def list_workloads(self) -> list[Workload]:
        if not self._watching:
            return await asyncio.to_thread(self._list_workloads)
        return [w for informer in self.workloads for w in informer.cache.values()]

    def _record_event(
        self, target: Workload | WorkloadRef, reason: str, message: str, event_type: EventType
    ) -> None:
        # An Event names the object's uid, or `kubectl describe` (which selects Events by uid)
        # does not show it: a watched workload carries its own (the watcher's Warnings name
        # it by reference); a target the executor read lately, the one remembered then.
        if not isinstance(target, Workload):
            watched = (i.cache.get(str(target)) for i in self.workloads)
            target = next((w for w in watched if w is not None), target)
        uid = "" if isinstance(target, Workload) else self._uids.get(target, "")
        try:
            self.events.record(target, reason, message, event_type=event_type, uid=uid)
        except (ApiException, urllib3.exceptions.HTTPError, OSError) as error:
            ref = target.ref if isinstance(target, Workload) else target
            raise _classified(ref, "record an event on", error) from error

    async def record_event(
        self,
        target: Workload | WorkloadRef,
        *,
        reason: str,
        message: str,
        event_type: EventType = "Warning",
    ) -> None:
        """An Event on the target (a Warning unless said otherwise); repeats within a window
        raise its count."""
        await asyncio.to_thread(self._record_event, target, reason, message, event_type)

    async def watch(self) -> AsyncIterator[ClusterChange]:
        if self._watching:
            raise RuntimeError("this port is already being watched")
        if self._following:
            # Its informers follow without emitting: a watch would miss what they took in.
            raise RuntimeError("a port that follows its listings is not watched; open another")
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[ClusterChange] = asyncio.Queue()
        stop = threading.Event()
        room = threading.Semaphore(WATCH_BUFFER)

        def emit(change: ClusterChange) -> None:
            while not room.acquire(timeout=0.5):
                if stop.is_set():
                    return  # the watch has ended: nobody takes this change
            loop.call_soon_threadsafe(queue.put_nowait, change)

        self._watching = True
        informers: list[tuple[str, Informer[Any]]] = [
            ("nodes", self.nodes),
            *(("pods", informer) for informer in self.pods.members),
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
                change = await queue.get()
                room.release()
                yield change
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
        uid = str((observed.obj.get("metadata") or {}).get("uid") or "")
        with self._recent_lock:
            self._recent_reads[target] = (time.monotonic(), observed)
            if len(self._recent_reads) > 1024:
                self._recent_reads.pop(next(iter(self._recent_reads)))
            self._uids[target] = uid
            self._uids.move_to_end(target)
            if len(self._uids) > 4096:
                self._uids.popitem(last=False)
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
    if said := message_of(error):  # e.g. the admission webhook's or policy's refusal
        message += f": {said[:500]}"
    transient = status is None or status in TRANSIENT_STATUSES
    return ClusterError(message, transient=transient, status=status)


def _relist_all(informers: Iterable[Informer[Any]]) -> None:
    for informer in informers:
        informer.relist("list")


def _fetch_all(informers: Iterable[Informer[Obj]]) -> list[dict[str, Obj]]:
    return [informer.fetch("list")[0] for informer in informers]


def _cached(informers: Iterable[Informer[Obj]]) -> list[Obj]:
    """Every cached object; each cache is copied at once, so an informer's thread writing it
    meanwhile cannot break the iteration."""
    return [obj for informer in informers for obj in list(informer.cache.values())]


def _unheard(change: ClusterChange) -> None:
    """A followed informer's changes: only its cache is read."""


def _started(informer: Informer[Any], stop: threading.Event) -> threading.Thread:
    """A thread keeping `informer`'s cache current (it resumes from its last list)."""
    thread = threading.Thread(
        target=informer.run, args=(_unheard, stop), name=f"follow-{informer.resource}", daemon=True
    )
    thread.start()
    return thread


def _join_all(threads: Iterable[threading.Thread], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    for thread in threads:
        thread.join(max(0.0, deadline - time.monotonic()))
