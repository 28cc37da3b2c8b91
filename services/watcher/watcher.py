"""The watcher loop: list, reconcile the KV snapshot, then follow the port's changes.

Every change is published first (core NATS, lowest latency) and then folded into the KV
snapshot by a writer task that coalesces bursts per key, so a burst of pod updates costs one
KV write per pod rather than one per update. At start the listed objects are compared with
what the snapshot already holds: only real differences are published, and objects deleted
while no watcher ran are published as deleted and removed.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Mapping
from dataclasses import replace
from typing import Protocol

from prometheus_client import Counter, Gauge
from pydantic import ValidationError

from tideshift.events import (
    DEAD_LETTER,
    NODE_CHANGED,
    POD_CHANGED,
    SNAPSHOT_BUCKET,
    WORKLOAD_CHANGED,
    DeadLetter,
    NodeChanged,
    PodChanged,
    WorkloadChanged,
)
from tideshift.services.cluster.core.autoscalers import Autoscaler, claims, held_reason
from tideshift.services.cluster.port import (
    ChangeType,
    ClusterChange,
    Node,
    Pod,
    Workload,
    WorkloadRef,
)
from tideshift.services.common.bus import TypedKV
from tideshift.services.common.bus.client import DEAD_LETTER_REASON_BYTES, one_line
from tideshift.services.common.bus.port import BusPort
from tideshift.services.common.clock import WALL_CLOCK, Clock, utc_now
from tideshift.services.common.memory import compact_tables, compacted, release_freed_memory
from tideshift.services.watcher.core.annotations import InvalidPolicy, workload_event
from tideshift.services.watcher.core.snapshot import (
    VersionOrder,
    node_event,
    node_key,
    object_key,
    older,
    pod_event,
    pod_key,
    same_state,
    workload_key,
)

# Snapshot writes after which an idle writer hands freed memory back to the OS (a burst).
TRIM_AFTER_WRITES = 10_000
# Keys waiting for their snapshot write past which the loop waits for the writer: a flood
# of changes is slowed to what the bucket takes instead of held in memory (a 100 s flood of
# distinct names held ~280 MB of pending events, and the allocators kept a third of it).
MAX_PENDING_WRITES = 4_096
# How long a deleted key's marker stays in the bucket: a plain KV delete leaves a marker per
# name for ever, so pods that come and go would grow the snapshot's stream without bound.
# A reader lists keys that hold a value, so an expired marker changes nothing it sees.
DELETE_MARKER_TTL_SECONDS = 600

log = logging.getLogger("tideshift.watcher")

CHANGES = Counter("tideshift_watcher_changes_total", "Changes published", ["resource", "change"])
FAILURES = Counter(
    "tideshift_watcher_failures_total", "Changes that could not be published or stored", ["stage"]
)
SNAPSHOT_OBJECTS = Gauge("tideshift_watcher_snapshot_objects", "Objects in the snapshot")
INVALID_POLICIES = Counter(
    "tideshift_watcher_invalid_policies_total", "Labelled workloads skipped for bad annotations"
)
STALE = Counter(
    "tideshift_watcher_stale_total",
    "Changes dropped as older than the state already taken (by resourceVersion)",
    ["resource"],
)
INVALID_POLICY_REASON = "TideshiftInvalidPolicy"
HELD_BY_ENGINE_REASON = "TideshiftLeftToEngine"
HELD_BY_ENGINE = Counter(
    "tideshift_watcher_held_by_engine_total",
    "Labelled workloads whose size another engine keeps (e.g. Kueue), told by a Warning Event",
)

OTHER_AUTOSCALERS = Counter(
    "tideshift_watcher_other_autoscalers_total",
    "Times a labelled workload was found targeted by another autoscaler (an HPA or a KEDA "
    "ScaledObject) that Tideshift yields to, by the autoscaler's kind",
    ["kind"],
)

ClusterEvent = NodeChanged | PodChanged | WorkloadChanged


class ClusterReader(Protocol):
    """List+watch of nodes, pods and labelled workloads: all the watcher reads of a cluster."""

    async def list_nodes(self) -> list[Node]: ...

    async def list_pods(self) -> list[Pod]: ...

    async def list_workloads(self) -> list[Workload]: ...

    def watch(self) -> AsyncIterator[ClusterChange]:
        """Changes after the last list, in order, until the iterator is closed."""
        ...

    def unwatched(self) -> list[str]:
        """Resources a running `watch` is not following right now (late changes)."""
        ...


class EventRecorder(Protocol):
    async def record_event(
        self, target: Workload | WorkloadRef, *, reason: str, message: str
    ) -> None:
        """Leave a warning on the object for its owner to see (`kubectl describe`)."""
        ...


class WatchedCluster(ClusterReader, EventRecorder, Protocol):
    """What the watcher needs of a cluster: to read it and to tell a workload's owner."""


class Watcher:
    """Publishes a port's changes and keeps the snapshot bucket in step."""

    def __init__(
        self,
        port: WatchedCluster,
        bus: BusPort,
        *,
        bucket: str = SNAPSHOT_BUCKET,
        clock: Clock = WALL_CLOCK,
        kv_concurrency: int = 32,
        max_pending_writes: int = MAX_PENDING_WRITES,
    ) -> None:
        self.port = port
        self.bus = bus
        self.bucket = bucket
        self.clock = clock
        self.kv_concurrency = kv_concurrency
        self.max_pending_writes = max_pending_writes
        self.snapshot: TypedKV | None = None
        self._expiring_deletes = True  # the bucket lets a delete marker expire (2.11+)
        self.published = 0
        self._pending: dict[str, ClusterEvent | None] = {}  # key -> latest value (None: delete)
        self._pending_ready = asyncio.Event()
        self._taken = asyncio.Event()  # the writer took a batch: there is room again
        self._idle = asyncio.Event()
        self._idle.set()
        self._reported: dict[str, str] = {}  # workload -> the invalid-policy message last recorded
        self._held_told: dict[str, str] = {}  # workload -> the held-by-engine reason last told
        self.order = VersionOrder()
        # Other autoscalers (HPAs, ScaledObjects) by the workload they target, and the last
        # state of each labelled workload, announced again when an autoscaler comes or goes.
        self._claims: dict[WorkloadRef, tuple[Autoscaler, ...]] = {}
        self._workloads: dict[WorkloadRef, Workload] = {}

    # -- conversion and publishing -------------------------------------------------------

    def _event(self, change: ChangeType, obj: Node | Pod | Workload) -> tuple[str, ClusterEvent]:
        now = utc_now(self.clock)
        if isinstance(obj, Node):
            return node_key(obj.name), node_event(change, obj, observed_at=now)
        if isinstance(obj, Workload):
            return workload_key(obj.ref), workload_event(change, obj, observed_at=now)
        return pod_key(obj.namespace, obj.name), pod_event(change, obj, observed_at=now)

    async def _publish(self, event: ClusterEvent) -> None:
        if isinstance(event, NodeChanged):
            await self.bus.publish(NODE_CHANGED.at(name=event.name), event)
            resource = "nodes"
        elif isinstance(event, WorkloadChanged):
            ref = event.workload
            subject = WORKLOAD_CHANGED.at(namespace=ref.namespace, kind=ref.kind, name=ref.name)
            await self.bus.publish(subject, event)
            resource = "workloads"
        else:
            await self.bus.publish(
                POD_CHANGED.at(namespace=event.namespace, name=event.name), event
            )
            resource = "pods"
        self.published += 1
        CHANGES.labels(resource, event.change).inc()

    def _store_later(self, key: str, event: ClusterEvent | None) -> None:
        self._pending[key] = event
        self._idle.clear()
        self._pending_ready.set()

    async def _invalid_policy(self, workload: Workload, error: InvalidPolicy) -> None:
        """Skip the workload (its last valid policy stands); tell its owner, count, dead-letter."""
        INVALID_POLICIES.inc()
        message = f"Tideshift skips {workload.ref}: {error}"
        key = str(workload.ref)
        if self._reported.get(key) == message:
            return  # already told; the object's status changes would repeat it
        self._reported[key] = message
        log.warning("%s", message)
        try:
            await self.port.record_event(workload, reason=INVALID_POLICY_REASON, message=message)
        except Exception as failure:  # the count and the dead letter still say it
            FAILURES.labels("record_event").inc()
            log.warning("cannot record an event on %s: %s", workload.ref, failure)
        ref = workload.ref
        payload = repr(dict(workload.annotations))
        letter = DeadLetter(
            consumer="watcher",
            original_subject=WORKLOAD_CHANGED.at(
                namespace=ref.namespace, kind=ref.kind, name=ref.name
            ).value,
            reason=one_line(message, DEAD_LETTER_REASON_BYTES),
            payload=payload[:1024],
            payload_bytes=len(payload.encode()),
            received_at=utc_now(self.clock),
        )
        try:
            await self.bus.publish_durable(DEAD_LETTER.at(consumer="watcher"), letter)
        except Exception as failure:
            FAILURES.labels("deadletter").inc()
            log.warning("cannot dead-letter %s: %s", workload.ref, failure)

    async def _tell_held(self, workload: Workload) -> None:
        """A Warning Event, once per reason, on a workload whose size another engine keeps."""
        key = str(workload.ref)
        if not workload.held_by:
            self._held_told.pop(key, None)
            return
        if self._held_told.get(key) == workload.held_by:
            return
        self._held_told[key] = workload.held_by
        HELD_BY_ENGINE.inc()
        message = f"Tideshift holds {workload.ref} where it is: {workload.held_by}"
        log.info("%s", message)
        try:
            await self.port.record_event(workload, reason=HELD_BY_ENGINE_REASON, message=message)
        except Exception as failure:  # the plan's reason and the count still say it
            FAILURES.labels("record_event").inc()
            log.warning("cannot record an event on %s: %s", workload.ref, failure)

    async def _room_for_a_write(self) -> None:
        while len(self._pending) >= self.max_pending_writes:
            self._taken.clear()
            await self._taken.wait()

    def _claimed(
        self,
        workload: Workload,
        table: Mapping[WorkloadRef, tuple[Autoscaler, ...]] | None = None,
    ) -> Workload:
        """The workload, held (`held_by`) while another autoscaler writes its replicas (by
        the autoscalers of `table`, else of those listed last)."""
        if workload.held_by:  # another engine's hold (Kueue) already says why
            return workload
        reason = held_reason(
            (self._claims if table is None else table).get(workload.ref, ()),
            dict(workload.annotations),
            serving=workload.role == "serving",
        )
        return replace(workload, held_by=reason) if reason else workload

    def autoscalers_of(self, ref: WorkloadRef) -> tuple[Autoscaler, ...]:
        """The other autoscalers last listed on this workload."""
        return self._claims.get(ref, ())

    async def autoscalers_changed(self, autoscalers: list[Autoscaler]) -> int:
        """Take the autoscalers listed now; announce again each workload whose hold they
        change (a new HPA: held, with a Warning Event; one deleted: Tideshift sizes it again).
        Returns how many workloads were announced again."""
        before = self._claims
        self._claims = claims(autoscalers)
        announced = 0
        for workload in list(self._workloads.values()):
            now, then = self._claimed(workload), self._claimed(workload, before)
            if now == then:
                continue
            if now.held_by and not then.held_by:
                OTHER_AUTOSCALERS.labels(self._claims[workload.ref][0].kind).inc()
            announced += 1
            await self.handle(ClusterChange("modified", workload))
        return announced

    async def handle(self, change: ClusterChange) -> None:
        """Publish one change and queue its snapshot update; never raises on bad input."""
        await self._room_for_a_write()
        if isinstance(change.obj, Workload):
            if change.type == "deleted":
                self._workloads.pop(change.obj.ref, None)
            else:
                self._workloads[change.obj.ref] = change.obj
            change = ClusterChange(change.type, self._claimed(change.obj))
        obj = change.obj
        if not self.order.admit(object_key(obj), change.type, obj.resource_version):
            STALE.labels(type(obj).__name__.lower()).inc()
            log.info("dropping %s %s: older than the state taken", change.type, object_key(obj))
            return
        try:
            key, event = self._event(change.type, change.obj)
        except InvalidPolicy as error:
            assert isinstance(change.obj, Workload)
            if change.type != "deleted":
                await self._invalid_policy(change.obj, error)
                return
            key = workload_key(change.obj.ref)  # gone: forget it, valid or not
            self._reported.pop(str(change.obj.ref), None)
            self._store_later(key, None)
            return
        except (ValidationError, ValueError, TypeError) as error:
            FAILURES.labels("convert").inc()
            log.warning("cannot convert %s change: %s", change.type, error)
            return
        if isinstance(event, WorkloadChanged):  # readable again: a new typo is told anew
            self._reported.pop(str(event.workload), None)
            if change.type != "deleted":
                assert isinstance(change.obj, Workload)
                await self._tell_held(change.obj)
        try:
            await self._publish(event)
        except Exception as error:  # a NATS hiccup costs this event, never the loop
            FAILURES.labels("publish").inc()
            log.warning("cannot publish %s: %s", key, error)
        self._store_later(key, None if change.type == "deleted" else event)

    # -- the snapshot ----------------------------------------------------------------------

    async def _write_one(self, key: str, event: ClusterEvent | None) -> None:
        assert self.snapshot is not None
        try:
            if event is None and self._expiring_deletes:
                await self.snapshot.purge_expiring(key, ttl_seconds=DELETE_MARKER_TTL_SECONDS)
            elif event is None:
                await self.snapshot.delete(key)
            else:
                await self.snapshot.put(key, event)
        except Exception as error:  # the next change of this key rewrites it
            FAILURES.labels("snapshot").inc()
            log.warning("cannot update snapshot key %s: %s", key, error)

    async def _snapshot_writer(self) -> None:
        written = 0  # since memory was last handed back
        while True:
            await self._pending_ready.wait()
            self._pending_ready.clear()
            written += len(self._pending)
            await self._write_all(self._pending)
            if not self._pending:
                if written >= TRIM_AFTER_WRITES:
                    # A burst's events are freed by now, but the tables keyed by their names
                    # keep the slots, and glibc keeps the rest in its arenas.
                    compact_tables(self.order)
                    self._reported = compacted(self._reported)
                    await asyncio.to_thread(release_freed_memory)
                    written = 0
                self._idle.set()

    async def _write_all(self, batch: dict[str, ClusterEvent | None]) -> None:
        """Write a batch (taking it from `_pending`). Its own frame: the writer then holds no
        reference to the batch while it waits for the next (a flood's last batch of deleted
        names was kept until the next change, measured)."""
        self._pending = {}
        self._taken.set()
        items = list(batch.items())
        batch.clear()
        for start in range(0, len(items), self.kv_concurrency):
            chunk = items[start : start + self.kv_concurrency]
            await asyncio.gather(*(self._write_one(key, event) for key, event in chunk))

    async def flushed(self) -> None:
        """Wait until every queued snapshot update has been written."""
        await self._idle.wait()

    async def _read_snapshot(self) -> dict[str, ClusterEvent]:
        assert self.snapshot is not None
        current: dict[str, ClusterEvent] = {}
        keys = await self.snapshot.keys()

        async def read(key: str) -> None:
            assert self.snapshot is not None
            model: type[ClusterEvent] = (
                NodeChanged
                if key.startswith("node.")
                else WorkloadChanged
                if key.startswith("workload.")
                else PodChanged
            )
            try:
                value = await self.snapshot.get(key, model)
            except ValueError as error:  # written by an older version, or damaged
                log.warning("snapshot key %s unreadable, replacing it: %s", key, error)
                return
            if value is not None:
                current[key] = value

        for start in range(0, len(keys), self.kv_concurrency):
            await asyncio.gather(*(read(key) for key in keys[start : start + self.kv_concurrency]))
        return current

    async def _listed(
        self, objects: list[Node | Pod | Workload], stored: dict[str, ClusterEvent]
    ) -> dict[str, ClusterEvent]:
        """The listed objects as events by key (a workload whose policy cannot be read keeps
        its stored one: it is not a deletion)."""
        listed: dict[str, ClusterEvent] = {}
        for obj in objects:
            try:
                key, event = self._event("added", obj)
            except InvalidPolicy as error:
                assert isinstance(obj, Workload)
                await self._invalid_policy(obj, error)
                key = workload_key(obj.ref)
                if key in stored:  # keep its last valid policy: not a deletion
                    listed[key] = stored[key]
                continue
            except (ValidationError, ValueError, TypeError) as error:
                FAILURES.labels("convert").inc()
                log.warning("cannot convert a listed object: %s", error)
                continue
            listed[key] = event
        return listed

    async def reconcile(self) -> int:
        """List the cluster, publish what differs from the snapshot, fix the snapshot.

        Returns how many differences were found.
        """
        self.snapshot = await self.bus.kv(self.bucket)
        self._expiring_deletes = await self.snapshot.expires_keys()
        if not self._expiring_deletes:
            log.warning(
                "snapshot bucket %s does not let keys expire (created before nats-server "
                "2.11?): each deleted object's marker stays; recreate the bucket to bound it",
                self.bucket,
            )
        nodes = await self.port.list_nodes()
        pods = await self.port.list_pods()
        workloads = await self.port.list_workloads()
        self._workloads = {workload.ref: workload for workload in workloads}
        workloads = [self._claimed(workload) for workload in workloads]
        for workload in workloads:
            await self._tell_held(workload)
        stored = await self._read_snapshot()
        listed = await self._listed([*nodes, *pods, *workloads], stored)
        differences = 0
        for key, listed_event in listed.items():
            old = stored.get(key)
            self.order.admit(key, "added", listed_event.resource_version)
            if old is not None and same_state(old, listed_event):
                continue
            if old is not None and older(listed_event.resource_version, old.resource_version):
                # Another watcher already stored a later state: keep it, do not go back.
                self.order.admit(key, "added", old.resource_version)
                continue
            event = listed_event
            if old is not None:
                event = listed_event.model_copy(update={"change": "modified"})
            differences += 1
            await self._publish_quietly(event)
            self._store_later(key, event)
        for key, old in stored.items():
            if key in listed:
                continue
            differences += 1
            self.order.admit(key, "deleted", old.resource_version)
            await self._publish_quietly(
                old.model_copy(update={"change": "deleted", "observed_at": utc_now(self.clock)})
            )
            self._store_later(key, None)
        SNAPSHOT_OBJECTS.set(len(listed))
        log.info(
            "snapshot reconciled: %d nodes, %d pods, %d workloads, %d differences",
            len(nodes),
            len(pods),
            len(workloads),
            differences,
        )
        return differences

    async def _publish_quietly(self, event: ClusterEvent) -> None:
        try:
            await self._publish(event)
        except Exception as error:  # a NATS hiccup costs this event, never the loop
            FAILURES.labels("publish").inc()
            log.warning("cannot publish a reconciled change: %s", error)

    # -- the loop --------------------------------------------------------------------------

    async def run(self, ready: asyncio.Event | None = None) -> None:
        """Reconcile, then publish changes until cancelled."""
        writer = asyncio.create_task(self._snapshot_writer(), name="snapshot-writer")
        try:
            await self.reconcile()
            watch = self.port.watch()
            try:
                if ready is not None:
                    ready.set()
                async for change in watch:
                    await self.handle(change)
            finally:
                with contextlib.suppress(Exception):
                    await watch.aclose()  # type: ignore[attr-defined]
        finally:
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self.flushed(), 5.0)
            writer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await writer
