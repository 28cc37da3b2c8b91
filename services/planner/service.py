"""`tideshift run planner`: cluster events + forecasts in, scale commands with reasons out.

The loop:
* Bootstraps the cluster view from the watcher's KV snapshot, after subscribing to the live
  node/pod subjects, so nothing between the read and the subscription is lost (for each
  object the newer observation wins).
* Plans on the leading edge of every relevant change (a change plans at once; changes during
  a plan, or within `debounce_seconds` of the last one, are coalesced into the next) and on a
  tick, with the registry's policy.
* Targets: those in its settings plus the workloads the watcher announces (labelled
  `tideshift.io/role`, `WorkloadChanged`); settings win on conflict. Workloads annotated
  `tideshift.io/paused` and targets an operator pinned (KV bucket `tideshift_pins`, written by
  `tideshift scale --for`) are left alone and reported in the plan (`services/planner/targets.py`).
* Publishes a `ScaleCommand` only where the desired count differs from what the target is
  known to want (its last command or executor result, else its live pods), each with the
  policy's reason, plus one `PlanDecided` per plan.
* Leads through a KV lease: a second planner keeps its state warm but stays passive (no
  commands) until the lease is free. Leadership and degraded-mode changes are announced as
  `PlannerStatus` events.
* The safety net: the latest observed demand per serving workload (`DemandObserved`, from
  the predictor; older than `observed_max_age_seconds` is ignored) goes into every plan, and
  one above what the last plan allowed for (its replicas x capacity_rps) plans at once.
* Stale inputs fall back to safe behaviour inside the policy: a workload without a fresh
  forecast keeps its replicas, and while any input is stale training does not grow. A
  watcher silent for `cluster_silence_seconds` (no node or pod event) marks the cluster view
  stale, which also stops serving scale-down.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import sys
import time
import uuid
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Literal, TypeVar

from prometheus_client import Counter, Gauge, Histogram
from pydantic import BaseModel, ConfigDict, Field, model_validator

from tideshift.events import (
    DEMAND_OBSERVED,
    FORECAST,
    NODE_CHANGED,
    PINS_BUCKET,
    PLAN_DECIDED,
    PLANNER_STATUS,
    POD_CHANGED,
    SCALE_COMMAND,
    SCALE_RESULT,
    WORKLOAD_CHANGED,
    BoundSubject,
    DemandObserved,
    Envelope,
    EventData,
    ForecastIssued,
    NodeChanged,
    PlanDecided,
    PlannerStatus,
    PodChanged,
    ScaleCommand,
    ScalePin,
    ScaleResult,
    WorkloadChanged,
)
from tideshift.events.models import TargetDecision as EventTargetDecision
from tideshift.services.cluster.overcommit import OvercommitConfig
from tideshift.services.common.bus import Bus, TypedKV
from tideshift.services.common.clock import WALL_CLOCK, Clock, utc_now, wait_for_event
from tideshift.services.common.retry import fixed
from tideshift.services.common.runtime import ServiceContext, run_service
from tideshift.services.common.settings import ServiceSettings, parse_settings
from tideshift.services.planner import policy as pol
from tideshift.services.planner.baselines import POLICIES, Policy, make_policy
from tideshift.services.planner.inputs import ClusterTable, plan_inputs
from tideshift.services.planner.targets import Held, TargetBook, Targets

log = logging.getLogger("tideshift.planner")
T = TypeVar("T", bound=EventData)

PLANS = Counter("tideshift_planner_plans_total", "Plans computed", ["trigger"])
COMMANDS = Counter("tideshift_planner_commands_total", "Scale commands published", ["role"])
SKIPPED = Counter("tideshift_planner_skipped_total", "Inputs skipped as unusable", ["kind"])
PLAN_SECONDS = Histogram("tideshift_planner_plan_seconds", "plan() duration")
LEADER = Gauge("tideshift_planner_leader", "1 while this planner holds the lease")
DEGRADED = Gauge("tideshift_planner_degraded", "1 while inputs are stale")

# The policy owns its tunables' defaults; the settings expose them.
_POLICY_DEFAULTS = pol.PolicyConfig()

# A subscription that broke (NATS gone, reconnecting) is made again after this wait.
RESUBSCRIBE_RETRY = fixed(1.0)
SNAPSHOT_BUCKET = "tideshift_cluster"  # the watcher's bucket (services/watcher/snapshot.py)


# Pods of a training job whose name contains one of these are its fixed helpers (parameter
# servers, coordinators), not trainers, unless they carry the tideshift.io/companion label.
DEFAULT_COMPANION_MARKERS = ("pserver", "-ps-", "coordinator", "master")


class ServingTarget(BaseModel):
    """A serving workload the planner sizes from its forecast."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: str = "Deployment"
    namespace: str = Field(min_length=1)
    name: str = Field(min_length=1)
    cpu: float = Field(ge=0, description="per-replica cpu request, cores")
    memory: float = Field(0.0, ge=0, description="per-replica memory request, bytes")
    gpu: int = Field(0, ge=0)
    capacity_rps: float = Field(gt=0, description="req/s one replica serves at target utilisation")
    min_replicas: int = Field(1, ge=0)
    max_replicas: int = Field(1000, ge=1)
    lead_time_s: float = Field(60.0, ge=0, description="pod start-up until ready")
    margin_s: float = Field(60.0, ge=0)
    stabilization_s: float = Field(300.0, ge=0)
    quantile: float = Field(pol.DEFAULT_SERVING_QUANTILE, gt=0, lt=1)
    target_utilization: float = Field(
        1.0,
        gt=0,
        le=1,
        description="fraction of its cpu request a replica uses while serving capacity_rps; "
        "batch jobs may borrow the rest (1: nothing of a busy replica is lent)",
    )


class TrainingTarget(BaseModel):
    """An elastic training job the planner resizes within [min, max] trainers."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: str = "PyTorchJob"
    namespace: str = Field(min_length=1)
    name: str = Field(min_length=1)
    cpu: float = Field(ge=0, description="per-trainer cpu request, cores")
    memory: float = Field(0.0, ge=0)
    gpu: int = Field(0, ge=0)
    min_trainers: int = Field(1, ge=1)
    max_trainers: int = Field(ge=1)
    gang_min: int | None = Field(None, ge=1)
    priority: int = 0
    weight: float = Field(1.0, gt=0)
    companion_markers: tuple[str, ...] = DEFAULT_COMPANION_MARKERS
    batch: bool = Field(
        False,
        description="trainers request tideshift.io/batch-cpu / batch-memory (cpu, memory: "
        "what one borrows) and run on serving's idle reservation, shrunk first",
    )

    @model_validator(mode="after")
    def _batch_borrows_no_gpu(self) -> TrainingTarget:
        if self.batch and self.gpu > 0:
            raise ValueError(f"{self.name}: batch: GPUs are not lent, expected gpu 0")
        return self


class PlannerSettings(ServiceSettings):
    """Plan serving and training scale from cluster events and forecasts; publish commands."""

    policy: str = Field(default="tideshift", description=f"one of {', '.join(POLICIES)}")
    serving: list[ServingTarget] = Field(
        default_factory=list,
        description="serving workloads besides those labelled tideshift.io/role (these win)",
    )
    training: list[TrainingTarget] = Field(
        default_factory=list,
        description="elastic jobs besides those labelled tideshift.io/role (these win)",
    )
    tick_seconds: float = Field(default=15.0, gt=0, description="plan at least this often")
    debounce_seconds: float = Field(
        default=0.0,
        ge=0,
        description="least time between change-triggered plans; 0: plan as soon as one ends",
    )
    pins_bucket: str = Field(default=PINS_BUCKET, pattern=r"^[A-Za-z0-9_-]+$")
    lease_name: str = Field(default="planner", pattern=r"^[A-Za-z0-9_-]+$")
    lease_ttl_seconds: float = Field(default=15.0, gt=0, description="leadership lease TTL")
    forecast_max_age_seconds: float = Field(
        default=_POLICY_DEFAULTS.max_forecast_age_s,
        gt=0,
        description="older forecasts are stale: hold that workload",
    )
    observed_max_age_seconds: float = Field(
        default=30.0,
        gt=0,
        description="older observed demand is ignored (the predictor sends it every 10 s)",
    )
    cluster_silence_seconds: float = Field(
        default=900.0, gt=0, description="no node/pod event this long: cluster view stale"
    )
    resend_seconds: float = Field(
        default=120.0, gt=0, description="re-issue a command not confirmed after this long"
    )
    snapshot_bucket: str = Field(default=SNAPSHOT_BUCKET, pattern=r"^[A-Za-z0-9_-]+$")
    max_trainer_removals_per_step: int = Field(
        default=_POLICY_DEFAULTS.max_trainer_removals_per_step,
        ge=1,
        description="at most this many trainers removed per planning step",
    )
    min_trainer_lifetime_seconds: float = Field(
        default=_POLICY_DEFAULTS.min_trainer_lifetime_s,
        ge=0,
        description="never remove a trainer younger than this (checkpoint)",
    )
    shrink_tolerance: float = Field(
        default=_POLICY_DEFAULTS.shrink_tolerance,
        ge=0,
        lt=1,
        description="skip shrinking a job for a smaller relative gain",
    )
    grow_tolerance: float = Field(
        default=_POLICY_DEFAULTS.grow_tolerance,
        ge=0,
        lt=1,
        description="skip growing a running job for a smaller gain",
    )
    rebalance_floor: float = Field(
        default=_POLICY_DEFAULTS.rebalance_floor,
        gt=0,
        le=1,
        description="move trainers between running jobs only until every job has this "
        "fraction of its fair share (1: rebalance to the fair share at once)",
    )
    batch_margin: float = Field(
        default=_POLICY_DEFAULTS.overcommit.margin,
        ge=0,
        lt=1,
        description="fraction of each node's allocatable never lent to batch trainers "
        "(the executor's batch_margin)",
    )
    batch_grow_after_seconds: float = Field(
        default=_POLICY_DEFAULTS.batch_grow_after_s,
        ge=0,
        description="batch trainers grow only into room that stayed reclaimable this long "
        "and that the forecast keeps as long (they shrink at once)",
    )


def _forecast(event: ForecastIssued) -> pol.Forecast:
    times = tuple(point.at.timestamp() for point in event.points)
    return pol.Forecast(
        issued_at=event.issued_at.timestamp(),
        times=times,
        quantiles={
            0.5: tuple(p.q50 for p in event.points),
            0.9: tuple(p.q90 for p in event.points),
            0.95: tuple(p.q95 for p in event.points),
            0.99: tuple(p.q99 for p in event.points),
        },
    )


@dataclass
class PlannerState:
    """What the planner knows; fed by events, read by `plan_once`."""

    settings: PlannerSettings
    clock: Clock = WALL_CLOCK
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
    # Clock time of the last node or pod event (from the start until the first one).
    last_cluster_event: float = field(init=False)
    changed: asyncio.Event = field(default_factory=asyncio.Event)
    book: TargetBook = field(default_factory=TargetBook)

    def apply_node(self, event: NodeChanged) -> None:
        previous = self.node_seen.get(event.name)
        if previous is not None and previous > event.observed_at:
            return  # something newer was applied already (live event vs snapshot)
        self.node_seen[event.name] = event.observed_at
        if event.change == "deleted":
            self.table.remove_node(event.name)
        else:
            amount = event.allocatable
            self.table.upsert_node(
                event.name,
                (amount.cpu, amount.memory, float(amount.gpu)),
                schedulable=event.ready and not event.unschedulable,
            )
        self.last_cluster_event = self.clock.now()
        self.changed.set()

    def apply_pod(self, event: PodChanged) -> None:
        key = (event.namespace, event.name)
        previous = self.pod_seen.get(key)
        if previous is not None and previous > event.observed_at:
            return
        self.pod_seen[key] = event.observed_at
        gone = event.change == "deleted" or event.phase in ("Succeeded", "Failed", "Unknown")
        if gone or event.deleting:
            self.table.remove_pod(key)
        else:
            owner = event.owner
            markers = self.companion_markers.get(owner) if owner is not None else None
            companion = event.companion or (
                markers is not None and any(m in event.name for m in markers)
            )
            amount = event.requests
            self.table.upsert_pod(
                key,
                node=event.node,
                requests=(amount.cpu, amount.memory, float(amount.gpu)),
                owner=owner,
                replica=not companion,
            )
        if event.change == "deleted":
            self.pod_seen.pop(key, None)
        self.last_cluster_event = self.clock.now()
        self.changed.set()

    @property
    def companion_markers(self) -> dict[pol.Target, tuple[str, ...]]:
        return self._markers

    def __post_init__(self) -> None:
        self.last_cluster_event = self.clock.now()
        self._markers = {
            pol.Target(j.namespace, j.kind, j.name): j.companion_markers
            for j in self.settings.training
        }
        self.book = TargetBook(self._static_serving(), self._static_jobs())

    def apply_workload(self, event: WorkloadChanged) -> None:
        target = event.workload
        if not self.book.apply(event):
            return
        if event.change == "deleted":
            self.known.pop(target, None)
            self.confirmed.pop(target, None)
            self.observed.pop(target, None)
            self.allowed_rps.pop(target, None)
        else:
            self.known[target] = event.replicas  # its spec, as the watcher last saw it
            if event.role == "training" and target not in self.book.static_targets():
                self._markers.setdefault(target, DEFAULT_COMPANION_MARKERS)
        self.changed.set()

    def apply_forecast(self, event: ForecastIssued) -> None:
        self.forecasts[event.workload] = _forecast(event)
        self.changed.set()

    def apply_observed(self, event: DemandObserved) -> None:
        """Keep the newest observation; one above what the last plan allowed plans at once."""
        target, at = event.workload, event.observed_at.timestamp()
        previous = self.observed.get(target)
        if previous is not None and previous[1] >= at:
            return  # out of order: a newer one is kept already
        self.observed[target] = (event.rps, at)
        fresh = self.clock.now() - at <= self.settings.observed_max_age_seconds
        allowed = self.allowed_rps.get(target)
        if fresh and allowed is not None and event.rps > allowed:
            self.changed.set()

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
        limit = self.settings.observed_max_age_seconds
        return {t: rps for t, (rps, at) in self.observed.items() if now - at <= limit}

    def apply_result(self, event: ScaleResult) -> None:
        target = event.target
        if event.outcome in ("applied", "noop") and event.current is not None:
            self.known[target] = event.current
            self.confirmed[target] = event.current
        elif event.outcome in ("rejected", "failed"):
            # Forget what we asked for, so a later plan re-issues it (after resend_seconds).
            self.known.pop(target, None)
            self.confirmed.pop(target, None)

    def _static_serving(self) -> tuple[pol.ServingWorkload, ...]:
        return tuple(
            pol.ServingWorkload(
                target=pol.Target(s.namespace, s.kind, s.name),
                replica_requests=(s.cpu, s.memory, float(s.gpu)),
                capacity_rps=s.capacity_rps,
                min_replicas=s.min_replicas,
                max_replicas=s.max_replicas,
                lead_time_s=s.lead_time_s,
                margin_s=s.margin_s,
                stabilization_s=s.stabilization_s,
                quantile=s.quantile,
                target_utilization=s.target_utilization,
            )
            for s in self.settings.serving
        )

    def _static_jobs(self) -> tuple[pol.TrainingJob, ...]:
        return tuple(
            pol.TrainingJob(
                target=pol.Target(j.namespace, j.kind, j.name),
                trainer_requests=(j.cpu, j.memory, float(j.gpu)),
                min_trainers=j.min_trainers,
                max_trainers=j.max_trainers,
                gang_min=j.gang_min,
                priority=j.priority,
                weight=j.weight,
                submitted_at=float(index),
                batch=j.batch,
            )
            for index, j in enumerate(self.settings.training)
        )

    def targets(self, pins: dict[pol.Target, ScalePin]) -> Targets:
        return self.book.targets(pins, utc_now(self.clock))

    def inputs(self, now: float, targets: Targets | None = None) -> pol.PlanInputs:
        settings = self.settings
        if targets is None:
            targets = self.targets({})
        return plan_inputs(
            self.table.view(),
            targets.serving,
            targets.jobs,
            dict(self.forecasts),
            wanted=self.known,
            config=pol.PolicyConfig(
                max_forecast_age_s=settings.forecast_max_age_seconds,
                max_trainer_removals_per_step=settings.max_trainer_removals_per_step,
                min_trainer_lifetime_s=settings.min_trainer_lifetime_seconds,
                shrink_tolerance=settings.shrink_tolerance,
                grow_tolerance=settings.grow_tolerance,
                rebalance_floor=settings.rebalance_floor,
                overcommit=OvercommitConfig(margin=settings.batch_margin),
                batch_grow_after_s=settings.batch_grow_after_seconds,
            ),
            cluster_stale=now - self.last_cluster_event > settings.cluster_silence_seconds,
            observed_rps=self.observed_rps(now),
        )


@dataclass
class Planner:
    """The planner's loop over a bus; `run` returns when `stopping` is set."""

    bus: Bus
    settings: PlannerSettings
    instance: str
    stopping: asyncio.Event
    ready: asyncio.Event = field(default_factory=asyncio.Event)
    clock: Clock = WALL_CLOCK
    leader: bool = False
    mode: Literal["normal", "degraded", "passive"] = "passive"
    reasons: tuple[str, ...] = ()
    plans: int = 0
    commands: int = 0

    def __post_init__(self) -> None:
        self.state = PlannerState(self.settings, clock=self.clock)
        self.policy: Policy[Any] = make_policy(self.settings.policy)
        self.policy_state: Any = self.policy.initial_state()
        self.sent: dict[pol.Target, tuple[int, float]] = {}
        self._pin_kv: TypedKV | None = None
        self._last_pins: dict[pol.Target, ScalePin] = {}

    async def run(self) -> None:
        tasks = [
            asyncio.create_task(self._follow(NODE_CHANGED.filter(), self.state.apply_node)),
            asyncio.create_task(self._follow(POD_CHANGED.filter(), self.state.apply_pod)),
            asyncio.create_task(self._follow(WORKLOAD_CHANGED.filter(), self.state.apply_workload)),
            asyncio.create_task(self._follow(FORECAST.filter(), self.state.apply_forecast)),
            asyncio.create_task(self._follow(DEMAND_OBSERVED.filter(), self.state.apply_observed)),
            asyncio.create_task(self._follow(SCALE_RESULT.filter(), self.state.apply_result)),
        ]
        lease = await self.bus.lease(
            self.settings.lease_name,
            holder=self.instance,
            ttl_seconds=self.settings.lease_ttl_seconds,
        )
        try:
            # Let the subscriptions register (and reach the server) before the snapshot read.
            for _ in range(5):
                await asyncio.sleep(0)
            await self.bus.flush()
            await self._bootstrap()
            tasks.append(asyncio.create_task(self._lead(lease)))
            self.ready.set()
            await self._plan_loop()
        finally:
            for task in tasks:
                task.cancel()
            for task in tasks:
                with contextlib.suppress(asyncio.CancelledError):
                    await task
            await lease.release()
            LEADER.set(0)

    async def _follow(self, subject: BoundSubject[T], apply: Callable[[T], None]) -> None:
        while True:  # a broken subscription is re-made; the loop never ends on bad input
            try:
                stream: AsyncIterator[Envelope[T]] = self.bus.subscribe(
                    subject, consumer=f"planner-{self.instance}"
                )
                async for envelope in stream:
                    try:
                        apply(envelope.data)
                    except Exception:  # one odd event must not stop the planner
                        SKIPPED.labels(subject.subject.model.__name__).inc()
                        log.exception("skipped an event on %s", subject.value)
            except asyncio.CancelledError:
                raise
            except Exception as error:
                log.warning("subscription to %s failed (%s); re-subscribing", subject.value, error)
                await asyncio.sleep(RESUBSCRIBE_RETRY.delay(1))

    async def _bootstrap(self) -> None:
        """Read the watcher's snapshot once; live events that arrive meanwhile still apply."""
        try:
            kv = await self.bus.kv(self.settings.snapshot_bucket)
            keys = await kv.keys()
        except Exception as error:  # no snapshot yet: start from live events only
            log.warning("no cluster snapshot in %s: %s", self.settings.snapshot_bucket, error)
            return
        loaded = 0
        for key in keys:
            try:
                if key.startswith("node."):
                    node = await kv.get(key, NodeChanged)
                    if node is not None:
                        self.state.apply_node(node)
                        loaded += 1
                elif key.startswith("workload."):
                    workload = await kv.get(key, WorkloadChanged)
                    if workload is not None:
                        self.state.apply_workload(workload)
                        loaded += 1
                elif key.startswith("pod."):
                    pod = await kv.get(key, PodChanged)
                    if pod is not None:
                        self.state.apply_pod(pod)
                        loaded += 1
            except Exception as error:
                SKIPPED.labels("snapshot").inc()
                log.warning("skipped snapshot key %s: %s", key, error)
        log.info("bootstrapped %d objects from %s", loaded, self.settings.snapshot_bucket)

    async def _lead(self, lease: Any) -> None:
        interval = self.settings.lease_ttl_seconds / 3
        while True:
            try:
                leading = await lease.try_acquire()
            except Exception as error:
                log.warning("lease renewal failed: %s", error)
                leading = False
            if leading != self.leader:
                self.leader = leading
                LEADER.set(1 if leading else 0)
                log.info("planner %s is %s", self.instance, "leader" if leading else "passive")
                if leading:
                    self.sent.clear()  # re-derive what to send from fresh state
                    self.state.changed.set()
                await self._announce()
            await asyncio.sleep(interval)

    async def _announce(self) -> None:
        mode: Literal["normal", "degraded", "passive"] = (
            "passive" if not self.leader else ("degraded" if self.reasons else "normal")
        )
        self.mode = mode
        status = PlannerStatus(
            planner=self.instance,
            leader=self.leader,
            mode=mode,
            reasons=self.reasons,
            at=utc_now(self.clock),
        )
        with contextlib.suppress(Exception):
            await self.bus.publish(PLANNER_STATUS.at(planner=self.instance), status)

    async def _plan_loop(self) -> None:
        settings, clock = self.settings, self.clock
        next_tick = clock.now()
        last_change_plan = -math.inf  # clock time of the last plan a change triggered
        while not self.stopping.is_set():
            changed = asyncio.ensure_future(self.state.changed.wait())
            stop = asyncio.ensure_future(self.stopping.wait())
            tick = asyncio.ensure_future(clock.sleep(next_tick - clock.now()))
            done, pending = await asyncio.wait(
                {changed, stop, tick}, return_when=asyncio.FIRST_COMPLETED
            )
            for task in pending:
                task.cancel()
            trigger = "change" if changed in done else "tick"
            if self.stopping.is_set():
                return
            if trigger == "change":
                # Leading edge: a change plans at once. Changes arriving during a plan or within
                # debounce_seconds of the last change-triggered one are coalesced into the next.
                hold = last_change_plan + settings.debounce_seconds - clock.now()
                if hold > 0 and await wait_for_event(clock, self.stopping, hold):
                    return
                last_change_plan = clock.now()
            self.state.changed.clear()
            try:
                await self.plan_once(trigger)
            except Exception:  # a failed plan is logged and retried on the next trigger
                log.exception("planning failed")
            if trigger == "tick" or clock.now() >= next_tick:
                next_tick = clock.now() + settings.tick_seconds

    async def _pins(self) -> dict[pol.Target, ScalePin]:
        """Operators' pins from the KV bucket; on a read failure, the last ones read."""
        try:
            if self._pin_kv is None:
                self._pin_kv = await self.bus.kv(self.settings.pins_bucket)
            self._last_pins = {pin.target: pin async for _, pin in self._pin_kv.items(ScalePin)}
        except Exception as error:
            SKIPPED.labels("pins").inc()
            log.warning("cannot read pins from %s: %s", self.settings.pins_bucket, error)
        return self._last_pins

    async def plan_once(self, trigger: str) -> None:
        now = self.clock.now()
        targets = self.state.targets(await self._pins())
        inputs = self.state.inputs(now, targets)
        started = time.perf_counter()
        decision, self.policy_state = self.policy.plan(inputs, self.policy_state, now)
        PLAN_SECONDS.observe(time.perf_counter() - started)
        PLANS.labels(trigger).inc()
        self.plans += 1
        self.state.remember_allowed(targets.serving, decision.targets)
        reasons = tuple(decision.fallbacks)
        if reasons != self.reasons:
            self.reasons = reasons
            DEGRADED.set(1 if reasons else 0)
            for reason in reasons:
                log.warning("degraded: %s", reason)
            await self._announce()
        if not self.leader:
            return
        plan_id = f"{self.instance}-{uuid.uuid4().hex[:12]}"
        issued_at = datetime.fromtimestamp(now, UTC)
        for held in targets.held:  # once released, it is compared with where it is then
            self.sent.pop(held.target, None)
        for item in decision.targets:
            if not self._differs(item, now):
                continue
            command = ScaleCommand(
                target=item.target,
                desired=item.desired,
                reason=item.reason[:2000],
                plan_id=plan_id,
                issued_at=issued_at,
                idempotency_key=f"{plan_id}:{item.target}",
            )
            subject = SCALE_COMMAND.at(
                namespace=item.target.namespace, kind=item.target.kind, name=item.target.name
            )
            try:
                await self.bus.publish_durable(subject, command, msg_id=command.idempotency_key)
            except Exception as error:
                log.warning("could not publish a command for %s: %s", item.target, error)
                continue
            self.sent[item.target] = (item.desired, now)
            self.state.known[item.target] = item.desired
            self.commands += 1
            COMMANDS.labels(item.role).inc()
            log.info("scale %s -> %d: %s", item.target, item.desired, item.reason)
        # Pinned and paused targets are reported beside the planned ones, with why.
        shown: list[pol.TargetDecision | Held] = [*decision.targets, *targets.held]
        plan = PlanDecided(
            plan_id=plan_id,
            policy=self.settings.policy,
            decided_at=issued_at,
            targets=tuple(
                EventTargetDecision(
                    target=item.target,
                    current=max(item.current, 0),
                    desired=item.desired,
                    reason=item.reason,
                )
                for item in shown
            ),
            infeasible=tuple(f"{item.target}: {item.reason}" for item in decision.infeasible),
        )
        with contextlib.suppress(Exception):
            await self.bus.publish(PLAN_DECIDED.at(policy=self.settings.policy), plan)

    def _differs(self, item: pol.TargetDecision, now: float) -> bool:
        """A real difference: not what the target wants already, nor what we just sent."""
        sent = self.sent.get(item.target)
        if sent is not None and sent[0] == item.desired:
            # Same as our last command: resend only if nothing confirmed it for a while.
            confirmed = self.state.confirmed.get(item.target) == item.desired
            return not confirmed and now - sent[1] >= self.settings.resend_seconds
        return item.desired != item.current


async def serve(context: ServiceContext, *, clock: Clock = WALL_CLOCK) -> None:
    """The service body; the demo passes its simulated clock (nothing else differs)."""
    settings = context.settings
    assert isinstance(settings, PlannerSettings)
    planner = Planner(
        context.bus, settings, context.instance, context.stopping, context.ready, clock=clock
    )
    await planner.run()


def main(argv: Sequence[str]) -> int:
    settings = parse_settings(PlannerSettings, argv, prog="tideshift run planner")
    if settings.policy not in POLICIES:
        print(
            f"tideshift run planner: invalid --policy {settings.policy!r}; "
            f"expected one of {', '.join(POLICIES)}",
            file=sys.stderr,
        )
        return 2
    return run_service("planner", settings, serve)
