"""Events on scale targets (Normal: what Tideshift did; Warning: what it could not do),
aggregated: the same reason on the same object within
`window_s` raises the count of the Event already written (as `kubectl describe` shows it:
"x12 over 5m") instead of creating one more, so a target skipped in every plan or a command
refused at every retry leaves one Event, not thousands.

What was written is remembered per (object, reason), at most `limit` of them (the oldest
forgotten first): a flood of distinct names costs bounded memory, and at worst a new Event.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Literal

from kubernetes.client.exceptions import ApiException

from tideshift.services.cluster.adapters.http import MERGE_PATCH, JsonObject, KubeHttp, status_of
from tideshift.services.cluster.core.kinds import API_VERSION
from tideshift.services.cluster.port import Workload, WorkloadRef

MESSAGE_LIMIT = 1024
EventType = Literal["Normal", "Warning"]


@dataclass
class _Written:
    name: str
    count: int
    at: float  # monotonic seconds of the last write


class EventWriter:
    """Creates Events, or counts repeats on the one already written."""

    def __init__(
        self, http: KubeHttp, *, component: str, window_s: float = 600.0, limit: int = 4096
    ) -> None:
        self.http = http
        self.component = component
        self.window_s = window_s
        self.limit = limit
        self._written: OrderedDict[tuple[WorkloadRef, str], _Written] = OrderedDict()
        self._lock = threading.Lock()

    def record(
        self,
        target: Workload | WorkloadRef,
        reason: str,
        message: str,
        *,
        event_type: EventType = "Warning",
        uid: str = "",
    ) -> None:
        """Blocking; raises the client's errors. One reason is always of one type. `uid`
        names a target given by reference (a Workload carries its own)."""
        ref = target.ref if isinstance(target, Workload) else target
        now = datetime.now(UTC).isoformat().replace("+00:00", "Z")
        with self._lock:
            written = self._written.get((ref, reason))
        if written is not None and time.monotonic() - written.at < self.window_s:
            patch = {
                "count": written.count + 1,
                "lastTimestamp": now,
                "message": message[:MESSAGE_LIMIT],
            }
            try:
                self.http.json(
                    "PATCH",
                    f"/api/v1/namespaces/{ref.namespace}/events/{written.name}",
                    body=patch,
                    content_type=MERGE_PATCH,
                )
            except ApiException as error:
                if status_of(error) != 404:  # gone (Events expire): write a new one
                    raise
            else:
                self._remember(ref, reason, _Written(written.name, written.count + 1, 0.0))
                return
        created = self.http.json(
            "POST",
            f"/api/v1/namespaces/{ref.namespace}/events",
            body=self._body(target, reason, message, now, uid) | {"type": event_type},
        )
        name = str((created.get("metadata") or {}).get("name", ""))
        if name:
            self._remember(ref, reason, _Written(name, 1, 0.0))

    def _remember(self, ref: WorkloadRef, reason: str, written: _Written) -> None:
        written.at = time.monotonic()
        with self._lock:
            self._written[(ref, reason)] = written
            self._written.move_to_end((ref, reason))
            while len(self._written) > self.limit:
                self._written.popitem(last=False)

    def _body(
        self, target: Workload | WorkloadRef, reason: str, message: str, now: str, uid: str
    ) -> JsonObject:
        ref = target.ref if isinstance(target, Workload) else target
        involved: JsonObject = {
            "apiVersion": API_VERSION.get(ref.kind, ""),
            "kind": ref.plain_kind,
            "name": ref.name,
            "namespace": ref.namespace,
        }
        if isinstance(target, Workload) and target.uid:
            involved |= {"uid": target.uid, "resourceVersion": target.resource_version}
        elif uid:
            involved["uid"] = uid
        return {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"generateName": f"{ref.name[:200]}.", "namespace": ref.namespace},
            "involvedObject": involved,
            "reason": reason,
            "message": message[:MESSAGE_LIMIT],
            "source": {"component": self.component},
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
        }
