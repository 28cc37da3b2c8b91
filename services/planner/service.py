"""`tideshift run planner`: cluster events + forecasts in, scale commands with reasons out.

The loop:
* Bootstraps the cluster view from the watcher's KV snapshot, after subscribing to the live
  subjects (for each object the newer observation wins), and re-reads it every 2 min to
  repair what a burst made the subscriptions drop (`services/planner/snapshot.py`).
* Keeps up: an event only updates the state; plans run one at a time in a thread, on a copy
  of their inputs, so the subscriptions drain meanwhile. A forecast, demand reading or
  workload change plans once the plan in flight ends; node/pod churn plans at most every
  `cluster_coalesce_seconds` (`PlanTrigger`); and a tick plans, with the registry's policy.
* Targets: those in its settings plus the workloads the watcher announces (labelled
  `tideshift.io/role`, `WorkloadChanged`); settings win on conflict. Workloads annotated
  `tideshift.io/paused` and targets an operator pinned (KV bucket `tideshift_pins`, written by
  `tideshift scale --for`) are left alone and reported in the plan (`planner/core/targets.py`).
* Publishes a `ScaleCommand` only where the desired count differs from what the target is
  known to want (its last command or executor result, else its live pods), each with the
  policy's reason, plus one `PlanDecided` per plan.
* Leads through a KV lease: a second planner keeps its state warm, passive (no commands)
  until the lease is free; leadership and degraded-mode changes go out as `PlannerStatus`.
* The safety net: the latest observed demand per serving workload (`DemandObserved`, from
  the predictor; older than `observed_max_age_seconds` is ignored) goes into every plan, and
  one above what the last plan allowed for (its replicas x capacity_rps) plans at once.
* Stale inputs fall back to safe behaviour inside the policy: a workload without a fresh
  forecast keeps its replicas, and while any input is stale training does not grow; a watcher
  silent (no node or pod event) for `cluster_silence_seconds` also stops serving scale-down.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from functools import partial
from typing import Any, Literal, TypeVar

from prometheus_client import Counter, Gauge, Histogram

from tideshift.events import (
    DEMAND_OBSERVED,
    FORECAST,
    JOB_PROGRESS,
    NODE_CHANGED,
    PLAN_DECIDED,
    PLANNER_STATUS,
    POD_CHANGED,
    SCALE_COMMAND,
    SCALE_RESULT,
    WORKLOAD_CHANGED,
    BoundSubject,
    Envelope,
    EventData,
    NodeChanged,
    PlannerStatus,
    PodChanged,
    ScaleCommand,
    ScalePin,
)
from tideshift.events.subjects import SERVING_NEED
from tideshift.services.common.bus import TypedKV, follow
from tideshift.services.common.bus.port import BusPort
from tideshift.services.common.clock import WALL_CLOCK, Clock, utc_now, wait_for_event
from tideshift.services.common.runtime import ServiceContext, service_main
from tideshift.services.planner import core as pol
from tideshift.services.planner import metrics, snapshot
from tideshift.services.planner.core.baselines import Policy, make_policy
from tideshift.services.planner.core.isolation import Quarantine
from tideshift.services.planner.core.state import PlannerState, PlanTrigger
from tideshift.services.planner.outputs import idempotency_key, plan_decided, skipped_held
from tideshift.services.planner.rise_store import RiseStore
from tideshift.services.planner.serving_need import serving_need_event
from tideshift.services.planner.settings import PlannerSettings

log = logging.getLogger("tideshift.planner")
T = TypeVar("T", bound=EventData)

PLANS = Counter("tideshift_planner_plans_total", "Plans computed", ["trigger"])
COMMANDS = Counter("tideshift_planner_commands_total", "Scale commands published", ["role"])
SKIPPED = Counter("tideshift_planner_skipped_total", "Inputs skipped as unusable", ["kind"])
PLAN_SECONDS = Histogram("tideshift_planner_plan_seconds", "plan() duration")
LEADER = Gauge("tideshift_planner_leader", "1 while this planner holds the lease")
DEGRADED = Gauge("tideshift_planner_degraded", "1 while inputs are stale")
UNPLANNABLE = Counter(
    "tideshift_planner_unplannable_total", "Targets left out of a plan: the policy raised on them"
)
PLAN_FAILURES = Counter("tideshift_planner_plan_failures_total", "Plans that raised")
# No plan succeeded this long: the planner is degraded and /readyz says so (a plan runs at
# least every tick_seconds, 15 s by default, so this is several missed plans).
PLAN_STALL_SECONDS = 120.0
PLAN_ID_LIMIT = 128  # ScaleCommand.plan_id's max_length
# A status is announced on every change, and again this often (wall seconds): the decision
# history keeps what was published, and one published before it existed was lost to it.
REANNOUNCE_S = 60.0
# /readyz says "behind" while more events wait to be applied than 1/BEHIND_FRACTION of one
# subscription's buffer: the planner is short of CPU and may soon drop some.
BEHIND_FRACTION = 8


@dataclass
class Planner:
    """The planner's loop over a bus; `run` returns when `stopping` is set."""

    bus: BusPort
    settings: PlannerSettings
    instance: str
    stopping: asyncio.Event
    ready: asyncio.Event = field(default_factory=asyncio.Event)
    # Set when a subscription dropped events (it fell behind): the snapshot is read at once.
    events_lost: asyncio.Event = field(default_factory=asyncio.Event)
    clock: Clock = WALL_CLOCK
    leader: bool = False
    mode: Literal["normal", "degraded", "passive"] = "passive"
    reasons: tuple[str, ...] = ()
    plans: int = 0
    commands: int = 0
    resync_s: float = snapshot.RESYNC_S  # how often the snapshot heals lost announcements
    announced_at: float = -math.inf  # wall time of the last status announcement
    # The last plan's decision and its time, leader or not: what a fresh planner computes,
    # compared by the leader-failover chaos test with the new leader's PlanDecided.
    last_decision: pol.Decision | None = None
    last_decision_at: float = -math.inf
    # Clock time of the last plan that succeeded (the start until the first one).
    last_plan_at: float = field(init=False)

    def __post_init__(self) -> None:
        self.state = PlannerState(self.settings.state_config(), started_at=self.clock.now())
        # When a plan is due; `changed` wakes the plan loop to look again.
        self.trigger = PlanTrigger(
            self.settings.debounce_seconds, self.settings.cluster_coalesce_seconds
        )
        self.changed = asyncio.Event()
        self.consumer = f"planner-{self.instance}"
        self.policy: Policy[Any] = make_policy(self.settings.policy)
        self.policy_state: Any = self.policy.initial_state()
        self.sent: dict[pol.Target, tuple[int, float]] = {}
        self._pin_kv: TypedKV | None = None
        self._last_pins: dict[pol.Target, ScalePin] = {}
        self.quarantine = Quarantine()
        self.rises = RiseStore.of(self.bus, self.settings)
        self.last_plan_at = self.clock.now()

    def readiness(self) -> list[str]:
        """Why /readyz says 503 beyond the runtime's checks: no plan succeeded for a while, or
        cluster events arrive late (the planner is behind the cluster)."""
        now, problems = self.clock.now(), []
        silent = now - self.last_plan_at
        if silent > PLAN_STALL_SECONDS:
            problems.append(f"degraded: no plan succeeded for {silent:.0f} s")
        # Its own backlog, not the producers' stamps: one event stamped long ago (a clock
        # apart, a replay) says nothing about this planner (tideshift_planner_ingest_lag_seconds
        # shows those).
        waiting = self.bus.slow_consumers.backlog(self.consumer)
        if waiting > self.settings.subscription_buffer // BEHIND_FRACTION:
            problems.append(f"behind: {waiting} events waiting to be applied")
        return problems

    async def run(self) -> None:
        state = self.state
        followed: list[tuple[BoundSubject[Any], Callable[[Any], None]]] = [
            (NODE_CHANGED.filter(), partial(self._apply_cluster, state.apply_node)),
            (POD_CHANGED.filter(), partial(self._apply_cluster, state.apply_pod)),
            (WORKLOAD_CHANGED.filter(), partial(self._apply, state.apply_workload)),
            (FORECAST.filter(), partial(self._apply, state.apply_forecast)),
            (DEMAND_OBSERVED.filter(), partial(self._apply, state.apply_observed)),
            (SCALE_RESULT.filter(), partial(self._apply, state.apply_result)),
            (JOB_PROGRESS.filter(), partial(self._apply, state.apply_progress)),
        ]
        tasks = [asyncio.create_task(self._follow(subject, apply)) for subject, apply in followed]
        tasks.append(asyncio.create_task(self._wake_on_stop()))
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
            resync = snapshot.resync(
                self.bus,
                self.settings.snapshot_bucket,
                self.state,
                clock=self.clock,
                stopping=self.stopping,
                changed=partial(self._wake, urgent=True),
                interval=self.resync_s,
                lost=self.events_lost,
            )
            tasks.append(asyncio.create_task(resync))
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

    async def _wake_on_stop(self) -> None:
        await self.stopping.wait()
        self.changed.set()  # the plan loop waits on it alone

    def _wake(self, *, urgent: bool) -> None:
        """A change calls for a plan: the plan loop looks when it is due."""
        self.trigger.mark(urgent=urgent)
        self.changed.set()

    def _apply(self, apply: Callable[[T, float], bool], event: T) -> None:
        """Fold an event into the state at the clock's time; one that calls for a plan has
        it as soon as the plan in flight ends."""
        if apply(event, self.clock.now()):
            self._wake(urgent=True)

    def _apply_cluster(
        self, apply: Callable[[Any, float], bool], event: NodeChanged | PodChanged
    ) -> None:
        """Fold a node/pod event in; it marks the view dirty (plans are coalesced)."""
        now = self.clock.now()
        metrics.INGEST_LAG.observe(max(0.0, now - event.observed_at.timestamp()))
        if apply(event, now):
            self._wake(urgent=False)

    async def _follow(self, subject: BoundSubject[T], apply: Callable[[T], None]) -> None:
        """Apply every event on `subject` until stopping; a broken subscription is made again
        with the bus's backoff, and one odd event is counted and skipped."""

        def handle(envelope: Envelope[T]) -> None:
            try:
                apply(envelope.data)
            except Exception:
                SKIPPED.labels(subject.subject.model.__name__).inc()
                raise  # `follow` logs it and goes on with the next event

        buffer, consumer = self.settings.subscription_buffer, self.consumer
        await follow(
            lambda: self.bus.subscribe(
                subject, consumer=consumer, buffer=buffer, on_drop=self.events_lost.set
            ),
            handle,
            clock=self.clock,
            stopping=self.stopping,
            name=f"planner subscription to {subject.value}",
        )

    async def _bootstrap(self) -> None:
        """Read the watcher's snapshot once; live events that arrive meanwhile still apply."""
        held = await snapshot.read(self.bus, self.settings.snapshot_bucket)
        if held is not None:  # else no snapshot yet: start from live events only
            loaded = snapshot.bootstrap(self.state, held, self.clock.now())
            self._wake(urgent=True)
            log.info("bootstrapped %d objects from %s", loaded, self.settings.snapshot_bucket)

    async def _lead(self, lease: Any) -> None:
        interval = self.settings.lease_ttl_seconds / 3
        while not self.stopping.is_set():
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
                    self._wake(urgent=True)
                await self._announce()
            elif WALL_CLOCK.now() - self.announced_at >= REANNOUNCE_S:
                await self._announce()  # a reader that missed the change still learns the mode
            # Wall seconds whatever the planner's clock: the lease's TTL runs in NATS.
            if await wait_for_event(WALL_CLOCK, self.stopping, interval):
                return

    async def _announce(self) -> None:
        mode: Literal["normal", "degraded", "passive"] = (
            "passive" if not self.leader else ("degraded" if self.reasons else "normal")
        )
        self.mode = mode
        self.announced_at = WALL_CLOCK.now()
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
        """Plan when the trigger says a change is due, or on the tick; one plan at a time,
        each on the state as it is when it starts (changes meanwhile go into the next)."""
        clock, trigger = self.clock, self.trigger
        next_tick = clock.now()
        while not self.stopping.is_set():
            now = clock.now()
            due = trigger.due_in(now)
            wait = next_tick - now if due is None else min(due, next_tick - now)
            if wait > 0:
                self.changed.clear()  # nothing ran since `due_in`: no change is missed
                await wait_for_event(clock, self.changed, wait)  # stopping sets it too
                continue  # look again: something changed, or the wait is over
            reason = "change" if due is not None and due <= 0 else "tick"
            trigger.start(now)
            try:
                await self.plan_once(reason)
            except Exception:  # a failed plan is logged and retried on the next trigger
                PLAN_FAILURES.inc()
                log.exception("planning failed")
            trigger.finish(clock.now())
            if reason == "tick" or clock.now() >= next_tick:
                next_tick = clock.now() + self.settings.tick_seconds

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
        targets = self.state.targets(await self._pins(), now)
        copying = time.perf_counter()
        # The inputs are copies (the cluster's arrays, the forecasts' dict), a few ms at
        # 150,000 pods: events applied while plan() runs in its thread cannot change them.
        inputs = self.state.inputs(now, targets)
        metrics.INPUTS_SECONDS.observe(time.perf_counter() - copying)
        metrics.record_inputs(inputs, self.state.book)
        self.policy_state = await self.rises.warm(self.policy_state, inputs.serving, now)
        # Off the event loop, so the subscriptions drain meanwhile; the policy state and the
        # quarantine are touched by this one plan only (the loop runs one at a time).
        decision, self.policy_state, skipped = await asyncio.to_thread(
            self._timed_plan, inputs, self.policy_state, now
        )
        metrics.record(inputs, decision, now)
        self.last_decision, self.last_decision_at = decision, now
        PLANS.labels(trigger).inc()
        self.plans += 1
        self.last_plan_at = now
        for target, reason in skipped.items():
            UNPLANNABLE.inc()
            log.warning("%s %s", target, reason)
        self.state.remember_allowed(targets.serving, decision.targets)
        await self.rises.save(self.policy_state, inputs.serving, now, leader=self.leader)
        reasons = tuple(decision.fallbacks)
        if reasons != self.reasons:
            metrics.log_degraded(self.reasons, reasons)
            self.reasons = reasons
            DEGRADED.set(1 if reasons else 0)
            await self._announce()
        if not self.leader:
            return
        plan_id = f"{self.instance[: PLAN_ID_LIMIT - 13]}-{uuid.uuid4().hex[:12]}"
        # Only targets this plan decides stay remembered as sent: a held one, once released, is
        # compared with where it is then, and one that left is forgotten.
        planned = decision.desired()
        self.sent = {t: sent for t, sent in self.sent.items() if t in planned}
        for item in decision.targets:
            if self._differs(item, now):
                await self._command(item, plan_id, now)
        plan = plan_decided(
            decision,
            policy=self.settings.policy,
            plan_id=plan_id,
            now=now,
            held=targets.held,
            skipped=skipped_held(inputs, skipped),
        )
        with contextlib.suppress(Exception):
            await self.bus.publish(PLAN_DECIDED.at(policy=self.settings.policy), plan)
        # Serving's need over the lead time, for the executor's quota lent to Kueue.
        try:
            need = serving_need_event(
                inputs, decision, plan_id=plan_id, policy=self.settings.policy, now=now
            )
            await self.bus.publish(SERVING_NEED.at(policy=self.settings.policy), need)
        except Exception as error:  # the plan is out; only the lending side misses it
            log.warning("could not publish serving's need of %s: %s", plan_id, error)

    def _timed_plan(
        self, inputs: pol.PlanInputs, policy_state: Any, now: float
    ) -> tuple[pol.Decision, Any, dict[pol.Target, str]]:
        """The policy's plan, timed in its own thread (not the wait for one)."""
        started = time.perf_counter()
        try:
            return self.quarantine.plan(self.policy, inputs, policy_state, now)
        finally:
            PLAN_SECONDS.observe(time.perf_counter() - started)

    async def _command(self, item: pol.TargetDecision, plan_id: str, now: float) -> None:
        """Publish one target's scale command and remember it as sent; one that cannot be
        made or sent is logged and skipped (the next plan tries again)."""
        try:
            command = ScaleCommand(
                target=item.target,
                desired=item.desired,
                reason=item.reason[:2000],
                plan_id=plan_id,
                issued_at=datetime.fromtimestamp(now, UTC),
                idempotency_key=idempotency_key(plan_id, item.target),
            )
            subject = SCALE_COMMAND.at(
                namespace=item.target.namespace, kind=item.target.kind, name=item.target.name
            )
            await self.bus.publish_durable(subject, command, msg_id=command.idempotency_key)
        except Exception as error:
            SKIPPED.labels("command").inc()
            log.warning("could not publish a command for %s: %s", item.target, error)
            return
        self.sent[item.target] = (item.desired, now)
        self.state.known[item.target] = item.desired
        self.commands += 1
        COMMANDS.labels(item.role).inc()
        log.info("scale %s -> %d: %s", item.target, item.desired, item.reason)

    def _differs(self, item: pol.TargetDecision, now: float) -> bool:
        """A real difference: not what the target wants already, nor what we just sent."""
        sent = self.sent.get(item.target)
        if sent is not None and sent[0] == item.desired:
            # Same as our last command: resend only if nothing confirmed it for a while.
            confirmed = self.state.confirmed.get(item.target) == item.desired
            return not confirmed and now - sent[1] >= self.settings.resend_seconds
        return item.desired != item.current


async def serve(
    settings: PlannerSettings, context: ServiceContext, *, clock: Clock = WALL_CLOCK
) -> None:
    """The service body; the demo passes its simulated clock (nothing else differs)."""
    planner = Planner(
        context.bus, settings, context.instance, context.stopping, context.ready, clock=clock
    )
    context.readiness_checks.append(planner.readiness)
    await planner.run()


main = service_main("planner", PlannerSettings, serve)
