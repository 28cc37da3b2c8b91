"""What the planner knows, folded from its events (cluster objects, targets, forecasts, observed
demand, executor results), and whether an event calls for a plan now. Pure: time is an
argument; imports no asyncio, nats, kubernetes or services.common, and reads no clock."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import TypeVar

from tideshift.events import (
    DemandObserved,
    ForecastIssued,
    JobProgress,
    NodeChanged,
    PodChanged,
    ScalePin,
    ScaleResult,
    WorkloadChanged,
)
from tideshift.events.models import QUANTILE_LEVELS
from tideshift.services.planner import core as pol
from tideshift.services.planner.core.inputs import ClusterTable, plan_inputs
from tideshift.services.planner.core.targets import TargetBook, Targets
from tideshift.services.planner.core.training.remaining import DEFAULT_WINDOW_S
from tideshift.services.planner.progress import ProgressBook

# Pods of a training job whose name contains one of these are its fixed helpers (parameter
# servers, coordinators), not trainers, unless they carry the tideshift.io/companion label.
DEFAULT_COMPANION_MARKERS = ("pserver", "-ps-", "coordinator", "master")

# Forecasts, demand readings and results kept for targets the planner does not manage (yet: a
# forecast may come before its workload's announcement); beyond this the oldest are dropped,
# so names nobody announced cannot grow the state without bound.
UNTRACKED_LIMIT = 1000
# Deleted nodes and pods remembered (so an older add, e.g. from the snapshot, cannot bring
# one back: a deletion wins); beyond these the oldest are forgotten.
DELETED_NODES_LIMIT = 10_000
DELETED_PODS_LIMIT = 50_000

# Clocks of our own services may disagree by this much: a stamp up to it ahead is kept as is.
FUTURE_SKEW_S = 5.0

K = TypeVar("K")
V = TypeVar("V")
E = TypeVar("E", NodeChanged, PodChanged, WorkloadChanged)


def clamped(event: E, now: float) -> E:
    """The event with an `observed_at` more than FUTURE_SKEW_S ahead of `now` taken as that.

    Clamped rather than refused: the observation itself is true, only the producer's clock is
    ahead; but a stamp from the future would make every later (real) observation look older
    and lose, so none may be ahead by more than the skew clocks are allowed.
    """
    if event.observed_at.timestamp() <= now + FUTURE_SKEW_S:
        return event
    return event.model_copy(
        update={"observed_at": datetime.fromtimestamp(now + FUTURE_SKEW_S, UTC)}
    )


@dataclass(frozen=True, slots=True)
class StateConfig:
    """What the state takes from the planner's settings."""

    serving: tuple[pol.ServingWorkload, ...]  # the settings' serving targets
    jobs: tuple[pol.TrainingJob, ...]  # the settings' training targets
    companion_markers: Mapping[pol.Target, tuple[str, ...]]  # of the settings' jobs
    policy: pol.PolicyConfig
    observed_max_age_s: float  # older observed demand is ignored
    cluster_silence_s: float  # no node or pod event this long: the cluster view is stale
    max_announced: int | None = None  # announced workloads planned at most (None: no bound)


@dataclass
class PlanTrigger:
    """When the next plan is due, so that a burst of events costs one more plan, not one per
    event. Urgent changes (forecasts, observed demand, workloads) plan as soon as the plan in
    flight ends (and `debounce_s` after the last one began); cluster churn (nodes, pods) only
    marks the view dirty and plans `cluster_s` after the last plan ended, or as long after
    as that plan took if longer: at 1,000 pod events/s a plan per event would keep a core
    busy, and back-to-back plans on churn alone (a cold list of 150,000 pods) would leave
    the events too little CPU to be applied on a loaded machine."""

    debounce_s: float
    cluster_s: float
    urgent: bool = False
    dirty: bool = False
    last_start: float = -math.inf  # when the last plan began
    last_end: float = -math.inf  # when it ended

    def mark(self, *, urgent: bool) -> None:
        if urgent:
            self.urgent = True
        else:
            self.dirty = True

    def due_in(self, now: float) -> float | None:
        """Seconds until a change plan is due (0: now); None when nothing changed."""
        if self.urgent:
            due = self.last_start + self.debounce_s
        elif self.dirty:
            took = max(0.0, self.last_end - self.last_start)
            due = max(self.last_start + self.debounce_s, self.last_end + max(self.cluster_s, took))
        else:
            return None
        return max(0.0, due - now)

    def start(self, now: float) -> None:
        """A plan begins at `now` on the latest state: what changed so far is in it."""
        self.urgent = self.dirty = False
        self.last_start = self.last_end = now

    def finish(self, now: float) -> None:
        """The plan begun last ended at `now`."""
        self.last_end = now


def forecast_of(event: ForecastIssued) -> pol.Forecast:
    """The policy's view of a forecast event."""
    times = tuple(point.at.timestamp() for point in event.points)
    per_point = [point.quantiles() for point in event.points]
    return pol.Forecast(
        issued_at=event.issued_at.timestamp(),
        times=times,
        quantiles={level: tuple(q[level] for q in per_point) for level in QUANTILE_LEVELS},
        untrusted=event.untrusted_reason,
    )


@dataclass
class PlannerState:
    """What the planner knows. Each `apply_*` folds one event in at time `now` (Unix seconds)
    and returns whether it calls for a plan now."""

    config: StateConfig
    started_at: float
    table: ClusterTable = field(default_factory=ClusterTable)
    # When each object was last observed: an older event (e.g. from the snapshot) loses.
    node_seen: dict[str, datetime] = field(default_factory=dict)
    pod_seen: dict[tuple[str, str], datetime] = field(default_factory=dict)
    forecasts: dict[pol.Target, pol.Forecast] = field(default_factory=dict)
    # Latest observed demand per workload: (req/s, Unix seconds observed).
    observed: dict[pol.Target, tuple[float, float]] = field(default_factory=dict)
    # The req/s each serving workload's last planned replicas serve (replicas x capacity).
    allowed_rps: dict[pol.Target, float] = field(default_factory=dict)
    # What each target is known to want (replicas), from our commands and executor results.
    known: dict[pol.Target, int] = field(default_factory=dict)
    confirmed: dict[pol.Target, int] = field(default_factory=dict)  # executor results only
    # Nodes deleted, oldest first (their `node_seen` entries are kept only for these).
    deleted_nodes: dict[str, None] = field(default_factory=dict)
    deleted_pods: dict[tuple[str, str], None] = field(default_factory=dict)
    # Announced workloads the last snapshot read lacked (see `resync_workloads`).
    snapshot_absent: set[pol.Target] = field(default_factory=set)
    # Nodes and pods the last snapshot read lacked, and when that read began.
    nodes_absent: set[str] = field(default_factory=set)
    pods_absent: set[tuple[str, str]] = field(default_factory=set)
    absent_since: datetime | None = None
    # Per table (by attribute name: a service may rebind a table to a compacted copy), its
    # targets nobody announced, oldest first (see `_keep`).
    untracked: dict[str, dict[pol.Target, None]] = field(default_factory=dict)
    # Unix seconds of the last node or pod event (from the start until the first one).
    last_cluster_event: float = field(init=False)
    companion_markers: dict[pol.Target, tuple[str, ...]] = field(init=False)
    book: TargetBook = field(init=False)
    # Training jobs' recent progress: each finite job's remaining work in every plan.
    progress: ProgressBook = field(default_factory=lambda: ProgressBook(DEFAULT_WINDOW_S))

    def __post_init__(self) -> None:
        self.last_cluster_event = self.started_at
        self.companion_markers = dict(self.config.companion_markers)
        self.book = TargetBook(self.config.serving, self.config.jobs, self.config.max_announced)

    def apply_node(self, event: NodeChanged, now: float) -> bool:
        event = clamped(event, now)
        previous = self.node_seen.get(event.name)
        if previous is not None and previous > event.observed_at:
            return False  # something newer was applied already (live event vs snapshot)
        self.node_seen.pop(event.name, None)  # re-inserted last: the dict is oldest first
        self.node_seen[event.name] = event.observed_at
        if event.change == "deleted":
            self._node_deleted(event.name)
        else:
            self.deleted_nodes.pop(event.name, None)
            amount = event.allocatable
            self.table.upsert_node(
                event.name,
                (amount.cpu, amount.memory, float(amount.gpu)),
                schedulable=event.ready and not event.unschedulable,
            )
        self.last_cluster_event = now
        return True

    def apply_pod(self, event: PodChanged, now: float) -> bool:
        event = clamped(event, now)
        key = (event.namespace, event.name)
        previous = self.pod_seen.get(key)
        if previous is not None and previous > event.observed_at:
            return False
        self.pod_seen.pop(key, None)  # re-inserted last: the dict is oldest first
        self.pod_seen[key] = event.observed_at
        gone = event.change == "deleted" or event.phase in ("Succeeded", "Failed", "Unknown")
        if gone or event.deleting:
            self.table.remove_pod(key)
        else:
            amount = event.requests
            self.table.upsert_pod(
                key,
                node=event.node,
                requests=(amount.cpu, amount.memory, float(amount.gpu)),
                owner=event.owner,
                replica=not self._is_companion(event),
            )
        if event.change == "deleted":
            self._pod_deleted(key)
        else:
            self.deleted_pods.pop(key, None)
        self.last_cluster_event = now
        return True

    def _is_companion(self, event: PodChanged) -> bool:
        """A job's fixed helper (labelled, or named by one of its job's markers), no trainer."""
        owner = event.owner
        markers = self.companion_markers.get(owner) if owner is not None else None
        return event.companion or (markers is not None and any(m in event.name for m in markers))

    def apply_workload(self, event: WorkloadChanged, now: float) -> bool:
        target = event.workload
        if not self.book.apply(clamped(event, now)):
            return False
        if event.change == "deleted":
            for table in (self.known, self.confirmed, self.observed, self.allowed_rps):
                table.pop(target, None)
            self.forecasts.pop(target, None)
            if target not in self.book.static_targets():
                self.companion_markers.pop(target, None)
        else:
            self.known[target] = event.replicas  # its spec, as the watcher last saw it
            if event.role == "training" and target not in self.book.static_targets():
                self.companion_markers.setdefault(target, DEFAULT_COMPANION_MARKERS)
        return True

    def resync_workloads(self, held: Mapping[pol.Target, WorkloadChanged], now: float) -> bool:
        """Make the announced workloads those of the watcher's snapshot (`held`, read whole);
        whether that calls for a plan. The live announcements drop events when a burst
        outruns their subscription (core NATS): a lost deletion would keep a gone workload,
        and its state, for ever. One announced (not static) workload absent from this and
        the previous snapshot gets a deletion; one absence is not enough, as its own
        announcement may be read before the watcher's snapshot write lands. Snapshot entries
        newer than what is held apply like a live announcement."""
        changed = False
        for target, event in held.items():
            known = self.book.announced.get(target)
            if known is None or event.observed_at > known.observed_at:
                changed = self.apply_workload(event, now) or changed
        missing = self.book.announced.keys() - held.keys() - self.book.static_targets()
        for target in sorted(missing & self.snapshot_absent):
            gone = self.book.announced[target].model_copy(update={"change": "deleted"})
            changed = self.apply_workload(gone, now) or changed
        self.snapshot_absent = missing - self.snapshot_absent
        return changed

    def resync_cluster(
        self, nodes: Sequence[NodeChanged], pods: Sequence[PodChanged], read_at: float, now: float
    ) -> dict[str, int]:
        """Heal the node/pod view with the watcher's snapshot (read whole, from `read_at`); how
        many of each kind it repaired. Live events lost to a burst leave holes: an entry newer
        than what was applied applies like a live event, and an object absent from this and
        the previous read gets a deletion stamped with the previous read's start (one absence
        is not enough: an object may be announced before its snapshot write lands), so an
        observation newer than that still wins, as does any older deletion over an add. The
        cluster's last event stays: a resync must not hide a silent watcher."""
        last_event = self.last_cluster_event
        repaired = {"node": 0, "pod": 0}
        for node in nodes:
            seen = self.node_seen.get(node.name)
            if (seen is None or seen < node.observed_at) and self.apply_node(node, now):
                repaired["node"] += 1
        for pod in pods:
            seen = self.pod_seen.get((pod.namespace, pod.name))
            if (seen is None or seen < pod.observed_at) and self.apply_pod(pod, now):
                repaired["pod"] += 1
        missing_nodes = self.node_seen.keys() - self.deleted_nodes.keys() - {n.name for n in nodes}
        missing_pods = (
            self.pod_seen.keys() - self.deleted_pods.keys() - {(p.namespace, p.name) for p in pods}
        )
        since = self.absent_since
        if since is not None:
            for name in sorted(missing_nodes & self.nodes_absent):
                repaired["node"] += self._forget_node(name, since)
            for key in sorted(missing_pods & self.pods_absent):
                repaired["pod"] += self._forget_pod(key, since)
        self.nodes_absent, self.pods_absent = missing_nodes, missing_pods
        self.absent_since = datetime.fromtimestamp(read_at, UTC)
        self.last_cluster_event = last_event
        return repaired

    def _forget_node(self, name: str, at: datetime) -> bool:
        """A deletion of `name` observed `at`, unless something newer was applied."""
        seen = self.node_seen.get(name)
        if seen is not None and seen > at:
            return False
        self.node_seen.pop(name, None)
        self.node_seen[name] = at
        self._node_deleted(name)
        return True

    def _node_deleted(self, name: str) -> None:
        self.table.remove_node(name)
        self.deleted_nodes[name] = None
        _trim(self.deleted_nodes, DELETED_NODES_LIMIT, self.node_seen)

    def _forget_pod(self, key: tuple[str, str], at: datetime) -> bool:
        """A deletion of the pod `key` observed `at`, unless something newer was applied."""
        seen = self.pod_seen.get(key)
        if seen is not None and seen > at:
            return False
        self.pod_seen.pop(key, None)
        self.pod_seen[key] = at
        self.table.remove_pod(key)
        self._pod_deleted(key)
        return True

    def _pod_deleted(self, key: tuple[str, str]) -> None:
        self.deleted_pods[key] = None
        _trim(self.deleted_pods, DELETED_PODS_LIMIT, self.pod_seen)

    def apply_forecast(self, event: ForecastIssued, now: float) -> bool:
        forecast = forecast_of(event)
        if forecast.issued_at > now + FUTURE_SKEW_S:  # else it would never age (see `clamped`)
            forecast = replace(forecast, issued_at=now + FUTURE_SKEW_S)
        self._keep("forecasts", self.forecasts, event.workload, forecast)
        return True

    def apply_observed(self, event: DemandObserved, now: float) -> bool:
        """Keep the newest observation; one above what the last plan allowed plans at once."""
        # A reading stamped in the future is taken as now (see `clamped`): else later true
        # readings would count as older and it would pin its workload until that future.
        target, at = event.workload, min(event.observed_at.timestamp(), now + FUTURE_SKEW_S)
        previous = self.observed.get(target)
        if previous is not None and previous[1] >= at:
            return False  # out of order: a newer one is kept already
        self._keep("observed", self.observed, target, (event.rps, at))
        fresh = now - at <= self.config.observed_max_age_s
        allowed = self.allowed_rps.get(target)
        return fresh and allowed is not None and event.rps > allowed

    def apply_progress(self, event: JobProgress, now: float) -> bool:
        """A training job's progress; the next plan estimates its remaining work from it."""
        self.progress.apply(event, now)
        return False

    def apply_result(self, event: ScaleResult, now: float) -> bool:
        """What the executor did; a result plans nothing by itself."""
        target = event.target
        if event.outcome in ("applied", "noop") and event.current is not None:
            self._keep("known", self.known, target, event.current)
            self._keep("confirmed", self.confirmed, target, event.current)
        elif event.outcome in ("rejected", "failed"):
            # Forget what we asked for, so a later plan re-issues it (after resend_seconds).
            self.known.pop(target, None)
            self.confirmed.pop(target, None)
        return False

    def _keep(self, name: str, table: dict[pol.Target, V], target: pol.Target, value: V) -> None:
        """`table[target] = value` (`table` is the attribute `name`), with at most
        UNTRACKED_LIMIT entries for targets that are not ours (the oldest such go first;
        re-inserted so the dict stays oldest first). `untracked` keeps the order of those per
        table, so a flood costs O(1) per event."""
        table.pop(target, None)
        table[target] = value
        if target in self.book.announced or target in self.book.static_targets():
            return
        order = self.untracked.setdefault(name, {})
        order.pop(target, None)
        order[target] = None
        while len(order) > UNTRACKED_LIMIT:
            oldest = next(iter(order))
            del order[oldest]
            if oldest not in self.book.announced:  # announced since: ours now, kept
                table.pop(oldest, None)

    def remember_allowed(
        self, serving: tuple[pol.ServingWorkload, ...], decided: Sequence[pol.TargetDecision]
    ) -> None:
        """What a plan allowed for: each serving workload's replicas x capacity_rps."""
        capacity = {w.target: w.capacity_rps for w in serving}
        for item in decided:
            if item.target in capacity:
                self.allowed_rps[item.target] = item.desired * capacity[item.target]

    def observed_rps(self, now: float) -> dict[pol.Target, float]:
        """The observations young enough to act on."""
        limit = self.config.observed_max_age_s
        return {t: rps for t, (rps, at) in self.observed.items() if now - at <= limit}

    def targets(self, pins: Mapping[pol.Target, ScalePin], now: float) -> Targets:
        return self.book.targets(pins, datetime.fromtimestamp(now, UTC))

    def inputs(self, now: float, targets: Targets | None = None) -> pol.PlanInputs:
        if targets is None:
            targets = self.targets({}, now)
        return plan_inputs(
            self.table.view(),
            targets.serving,
            self.progress.attach(targets.jobs),
            dict(self.forecasts),
            wanted=self.known,
            config=self.config.policy,
            cluster_stale=now - self.last_cluster_event > self.config.cluster_silence_s,
            observed_rps=self.observed_rps(now),
        )


def _trim(deleted: dict[K, None], limit: int, seen: dict[K, datetime]) -> None:
    """Forget the oldest deleted names beyond `limit` (and when they were seen)."""
    while len(deleted) > limit:
        name = next(iter(deleted))
        del deleted[name]
        seen.pop(name, None)
