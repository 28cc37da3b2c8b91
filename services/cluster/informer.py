"""List+watch of one Kubernetes resource into a cache, like a client-go informer, and the
ReplicaSet owner cache the pods' informer resolves through.

Decides when to relist, resume or back off; converting objects is `cluster.core.conversions`, and
the port (`cluster.kubernetes`) runs one informer per resource in its own thread because the
client blocks. Imports the client only for its errors; never the bus or a service.

* list (paged), remember the list's resourceVersion, then watch from it with bookmarks, so a
  reconnect resumes where the last event or bookmark left off and misses nothing;
* a 410 Gone (the apiserver no longer holds that version) or the periodic resync relists and
  emits only the real differences from what was already seen: added, deleted, and changed
  objects;
* an object whose conversion changes nothing Tideshift reads (a node heartbeat, a status
  timestamp) is not emitted at all;
* connection errors reconnect with exponential backoff; one bad object is logged, counted
  and skipped; the loop never exits until the watch is closed.
"""

from __future__ import annotations

import contextlib
import json
import logging
import threading
import time
from collections import ChainMap, OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Generic

import urllib3.exceptions
from kubernetes.client.exceptions import ApiException
from prometheus_client import Counter

from tideshift.services.cluster.adapters.http import JsonObject, KubeHttp, status_of
from tideshift.services.cluster.core.conversions import (
    Obj,
    controller_reference,
    diff,
    direct_owner,
    same_content,
)
from tideshift.services.cluster.core.kinds import unwatchable
from tideshift.services.cluster.port import ChangeType, ClusterChange, WorkloadRef
from tideshift.services.common.retry import Backoff, exponential

log = logging.getLogger("tideshift.cluster.kubernetes")

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
        fresh, resource_version = self.fetch(cause)
        changes = diff(self.cache, fresh)
        self.cache = fresh
        self.resource_version = resource_version
        return changes

    def fetch(self, cause: str) -> tuple[dict[str, Obj], str]:
        """A fresh (paged) list, by key, and its resourceVersion; the cache is left alone."""
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
                return fresh, str(metadata.get("resourceVersion", ""))

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
        if unwatchable(status_of(error), self.resource) and not self.resource_version:
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


class InformerGroup(Generic[Obj]):
    """One resource's informers, one per watched namespace, read as one: a Role in each
    namespace grants no cluster-wide list, so a port limited to some namespaces lists and
    watches each of them on its own (the caches never share a key: keys carry the namespace)."""

    def __init__(self, members: list[Informer[Obj]]) -> None:
        self.members: list[Informer[Obj]] = members
        self.resource = members[0].resource

    @property
    def cache(self) -> Mapping[str, Obj]:
        caches: list[dict[str, Obj]] = [member.cache for member in self.members]
        return ChainMap(*caches)

    @property
    def watching(self) -> bool:
        return all(member.watching for member in self.members)

    def relist(self, cause: str) -> None:
        for member in self.members:
            member.relist(cause)


class OwnerCache:
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
