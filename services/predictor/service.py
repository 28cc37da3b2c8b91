"""`tideshift run predictor`: forecasts per serving workload, published on NATS each step.

Workloads are those in its settings plus every serving workload the watcher announces
(`WorkloadChanged`, labelled `tideshift.io/role: serving`; its demand query from the
annotation `tideshift.io/demand-query`, else the query template): a new one is forecast at
once, a removed one is dropped; the settings win on conflict. For each workload the
predictor range-queries its demand (requests per second), refits its model on a cadence,
updates it with each new sample, and publishes a `ForecastIssued` on `FORECAST` every step.
Every `observe_seconds` (independent of the forecast) it also publishes the workload's latest
measured demand, a `DemandObserved` on `DEMAND_OBSERVED`: the planner's safety net reacts to
it at once when it runs above what the last plan allowed for.
When the source is down, slow, or answers with nothing usable, it keeps publishing the last
good model's forecast marked stale, with its upper quantiles widened the longer the outage
lasts; it logs once per outage and recovers by itself when data returns.
With `sharded`, replicas share the workloads: each forecasts (and observes) only those it
owns among the live members (`membership.py` keeps this replica's key, `shards.py` decides),
and hands them over as replicas join and leave; it still follows every announcement, so it
can take a workload over at once.
This module runs the loops; one workload's queries and events are in `forecaster.py`, what to
keep, refit and widen is decided in `forecasting.py` (shared with `tideshift simulate`), the
settings are in `settings.py`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from prometheus_client import Counter, Gauge

from tideshift.events.models import ForecastIssued, WorkloadChanged, WorkloadRef
from tideshift.events.subjects import DEMAND_OBSERVED, FORECAST, WORKLOAD_CHANGED
from tideshift.services.common.bus import follow
from tideshift.services.common.clock import WALL_CLOCK, Clock, wait_for_event
from tideshift.services.common.memory import compact_tables, release_freed_memory
from tideshift.services.common.runtime import ServiceContext, service_main
from tideshift.services.predictor.core.forecasting import warm_up
from tideshift.services.predictor.forecaster import WorkloadForecaster, forget_metrics
from tideshift.services.predictor.membership import Membership
from tideshift.services.predictor.settings import PredictorSettings, WorkloadQuery
from tideshift.services.predictor.sources import MetricSource, PrometheusSource, SimMetricSource

log = logging.getLogger("tideshift.predictor")

# How often the announced workloads are checked against the watcher's snapshot (seconds).
RESYNC_S = 120.0
# Announcements waiting to be applied (~1 KB each) before the subscription drops: a burst of
# new workloads (each starting its loops) must not lose the deletions queued behind it.
ANNOUNCEMENTS_BUFFER = 16_384
# Model fits running at once (each in a thread): see WorkloadForecaster._learn.
FITS_AT_ONCE = 2
# A sharded replica remembers the announced workloads it does not own (to take one over at
# once), at most this many times max_announced_workloads: a share each for up to 20
# replicas. A spec is ~1 KB, against ~5 MB for a forecast workload.
KNOWN_PER_FORECAST = 20

WORKLOADS = Gauge("tideshift_predictor_workloads", "workloads being forecast")
REFUSED = Counter(
    "tideshift_predictor_announcements_skipped_total",
    "announced workloads not forecast: max_announced_workloads reached",
)


def build_source(settings: PredictorSettings) -> MetricSource:
    if settings.metric_source == "sim":
        from tideshift.loadgen.core.profiles import DiurnalProfile

        profile = DiurnalProfile(peak_rps=settings.sim_peak_rps, trough_rps=settings.sim_trough_rps)
        return SimMetricSource(profile.rate)
    return PrometheusSource(settings.prometheus_url, timeout_s=settings.query_timeout_seconds)


async def serve(
    settings: PredictorSettings,
    context: ServiceContext,
    *,
    clock: Clock = WALL_CLOCK,
    source: MetricSource | None = None,
    on_forecast: Callable[[ForecastIssued], Awaitable[None]] | None = None,
) -> None:
    """The service body: one forecasting loop per workload until `context.stopping`."""
    membership = Membership(context.bus, settings, context.instance) if settings.sharded else None
    fleet = Fleet(
        settings,
        context,
        clock=clock,
        source=source or build_source(settings),
        on_forecast=on_forecast,
        membership=membership,
    )
    if membership is not None:
        await membership.open()
    for spec in settings.workloads:
        fleet.start(spec)
    follower = asyncio.create_task(fleet.follow())
    resyncing = asyncio.create_task(fleet.resync())
    keeping = (
        asyncio.create_task(membership.keep(context.stopping, fleet.reconcile))
        if membership is not None
        else None
    )
    try:
        try:
            await asyncio.to_thread(warm_up, settings.model, settings.cadence())
        except Exception:  # each workload's own fit reports what is wrong with its data
            log.exception("warming up model %s failed; forecasting anyway", settings.model)
        await fleet.bootstrap()
        context.ready.set()
        await context.stopping.wait()
    finally:
        for task in (follower, resyncing, keeping):
            if task is not None:
                task.cancel()
        await fleet.stop_all()
        if membership is not None:
            await membership.leave()


def _spec_of(event: WorkloadChanged) -> WorkloadQuery:
    ref, policy = event.workload, event.serving
    return WorkloadQuery(
        namespace=ref.namespace,
        name=ref.name,
        kind=ref.kind,
        query=policy.demand_query if policy is not None else "",
    )


@dataclass
class Fleet:
    """The running forecast loops: the settings' workloads, and one per serving workload the
    watcher announces (started at once, stopped on its removal); the settings win."""

    settings: PredictorSettings
    context: ServiceContext
    clock: Clock
    source: MetricSource
    on_forecast: Callable[[ForecastIssued], Awaitable[None]] | None = None
    membership: Membership | None = None  # sharded: forecast only the workloads it owns
    # Sharded: every workload to forecast, this replica's or not (to take one over at once).
    wanted: dict[WorkloadRef, WorkloadQuery] = field(default_factory=dict)
    loops: dict[WorkloadRef, tuple[WorkloadQuery, asyncio.Task[None]]] = field(default_factory=dict)
    static: set[WorkloadRef] = field(default_factory=set)
    full: bool = False  # the announced-workload cap was reached (logged once per episode)
    fits: asyncio.Semaphore = field(default_factory=lambda: asyncio.Semaphore(FITS_AT_ONCE))
    releasing: asyncio.Task[None] | None = None
    resync_s: float = RESYNC_S

    def _announced_count(self) -> int:
        return len(self.loops) - len(self.static & self.loops.keys())

    def _remember(self, ref: WorkloadRef, spec: WorkloadQuery) -> bool:
        """Keep a sharded replica's list of every workload, bounded (counted past it)."""
        limit = KNOWN_PER_FORECAST * max(self.settings.max_announced_workloads, 1)
        if ref not in self.wanted and ref not in self.static and len(self.wanted) >= limit:
            REFUSED.inc()
            return False
        self.wanted[ref] = spec
        return True

    def mine(self, ref: WorkloadRef) -> bool:
        """Whether this replica forecasts `ref` now (always, unless sharded)."""
        return self.membership is None or self.membership.owns(str(ref))

    def start(self, spec: WorkloadQuery, *, announced: bool = False) -> None:
        ref = WorkloadRef(spec.namespace, spec.kind, spec.name)
        if not announced:
            self.static.add(ref)
        if self.membership is not None:
            if not self._remember(ref, spec):
                return
            if not self.mine(ref):
                self._stop(ref, "another replica owns it")
                return
        running = self.loops.get(ref)
        if running is not None:
            if running[0] == spec:
                return
            running[1].cancel()  # its query changed: start over with the new one
        elif announced and self._announced_count() >= self.settings.max_announced_workloads:
            REFUSED.inc()
            if not self.full:
                log.warning(
                    "%s: not forecast: %d announced workloads already (max_announced_workloads); "
                    "further ones are counted and skipped",
                    ref,
                    self.settings.max_announced_workloads,
                )
            self.full = True
            return
        forecaster = WorkloadForecaster(
            spec=spec, settings=self.settings, source=self.source, clock=self.clock, fits=self.fits
        )
        loops = [
            _loop(
                forecaster,
                context=self.context,
                interval_s=self.settings.refresh_seconds or self.settings.step_seconds,
                on_forecast=self.on_forecast,
                gate=partial(self.mine, ref),
            )
        ]
        if self.settings.observe_seconds > 0:
            loops.append(
                _observe_loop(
                    forecaster,
                    context=self.context,
                    interval_s=self.settings.observe_seconds,
                    gate=partial(self.mine, ref),
                )
            )
        task = asyncio.create_task(_all(loops))
        self.loops[ref] = (spec, task)
        WORKLOADS.set(len(self.loops))
        log.info("%s: forecasting (%s)", ref, "announced" if announced else "settings")

    def apply(self, event: WorkloadChanged) -> None:
        ref = event.workload
        if event.role != "serving" or ref in self.static:
            return
        if event.change == "deleted":
            self.remove(ref)
            return
        self.start(_spec_of(event), announced=True)

    def remove(self, ref: WorkloadRef) -> None:
        self.wanted.pop(ref, None)
        if self.membership is not None:
            self.membership.shard.forget(str(ref))
        self._stop(ref, "removed")

    def _stop(self, ref: WorkloadRef, reason: str) -> None:
        running = self.loops.pop(ref, None)
        if running is not None:
            running[1].cancel()
            WORKLOADS.set(len(self.loops))
            forget_metrics(f"{ref.namespace}/{ref.name}")
            self._release_soon()
            self.full = False
            log.info("%s: %s; no longer forecast here", ref, reason)

    def reconcile(self) -> None:
        """After a membership round: start the loops of the workloads this replica owns now,
        stop those it no longer owns (all of them once its authority lapsed)."""
        for ref, spec in list(self.wanted.items()):
            if self.mine(ref) != (ref in self.loops):
                self.start(spec, announced=ref not in self.static)

    def _release_soon(self) -> None:
        """Hand the memory of removed workloads back to the OS, once per burst of removals."""
        if self.releasing is None or self.releasing.done():
            self.releasing = asyncio.create_task(self._release())

    async def _release(self) -> None:
        # A second later: the removed workloads' tasks have ended and dropped their models.
        if not await wait_for_event(self.clock, self.context.stopping, 1.0):
            compact_tables(self)  # its tables keep the slots of every workload removed
            await asyncio.to_thread(release_freed_memory)

    async def follow(self) -> None:
        """Apply the watcher's workload announcements until the service stops."""
        await follow(
            lambda: self.context.bus.subscribe(
                WORKLOAD_CHANGED.filter(), consumer="predictor", buffer=ANNOUNCEMENTS_BUFFER
            ),
            lambda envelope: self.apply(envelope.data),
            clock=self.clock,
            stopping=self.context.stopping,
            name="workload announcements",
        )

    async def snapshot(self) -> dict[WorkloadRef, WorkloadChanged] | None:
        """The workloads the watcher's snapshot holds; None when it cannot be read."""
        try:
            kv = await self.context.bus.kv(self.settings.snapshot_bucket)
            values = await kv.values()  # one pass, not a request per key
        except Exception as error:  # no snapshot yet: live announcements only
            log.warning("no workloads from %s: %s", self.settings.snapshot_bucket, error)
            return None
        held = {}
        for key, value in values.items():
            if key.startswith("workload."):
                try:
                    event = WorkloadChanged.model_validate_json(value)
                except ValueError as error:  # the watcher wrote it: skip, say so, go on
                    log.warning("snapshot %s: unreadable %s: %s", kv.bucket, key, error)
                    continue
                held[event.workload] = event
        return held

    async def bootstrap(self) -> None:
        """The workloads announced before this predictor started, from the snapshot."""
        for event in (await self.snapshot() or {}).values():
            self.apply(event)

    async def resync(self) -> None:
        """Every `resync_s`, the announced workloads become those of the snapshot. The
        announcements' subscription drops when a burst outruns it (core NATS): a lost
        deletion would forecast a gone workload for ever, a lost addition never forecast a
        new one. A workload is removed once absent from two snapshots in a row (its own
        announcement may be read before the watcher's snapshot write lands)."""
        absent: set[WorkloadRef] = set()
        wait = self.resync_s
        while not await wait_for_event(self.clock, self.context.stopping, wait):
            held = await self.snapshot()
            # A failed read (a busy server) is tried again soon, not a whole period later.
            wait = self.resync_s if held is not None else min(self.resync_s, 10.0)
            if held is None:
                continue
            announced = (set(self.loops) | set(self.wanted)) - self.static
            for ref in absent & (announced - held.keys()):
                self.remove(ref)
            absent = announced - held.keys()
            for event in held.values():
                self.apply(event)

    async def stop_all(self) -> None:
        tasks = [task for _, task in self.loops.values()]
        tasks += [self.releasing] if self.releasing is not None else []
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task


async def _loop(
    forecaster: WorkloadForecaster,
    *,
    context: ServiceContext,
    interval_s: float,
    on_forecast: Callable[[ForecastIssued], Awaitable[None]] | None,
    gate: Callable[[], bool],
) -> None:
    subject = FORECAST.at(namespace=forecaster.spec.namespace, workload=forecaster.spec.name)
    published = False
    clock = forecaster.clock
    while not context.stopping.is_set():
        started = clock.now()
        try:
            event = await forecaster.tick()
            # Asked last, just before publishing: a replica that lost its share (or stalled
            # in the fit) must not publish what another replica now forecasts.
            if event is not None and gate():
                await context.bus.publish(subject, event)
                if not published:
                    published = True
                    log.info(
                        "%s: first forecast published on %s (model %s)",
                        forecaster.label,
                        subject,
                        event.model,
                    )
                if on_forecast is not None:
                    await on_forecast(event)
        except Exception:
            # A control loop never dies on one bad step: log it and try again next step.
            log.exception("%s: forecasting step failed", forecaster.label)
        await wait_for_event(clock, context.stopping, interval_s - (clock.now() - started))


async def _all(loops: list[Coroutine[Any, Any, None]]) -> None:
    """One task per workload: cancelling it stops all of the workload's loops."""
    await asyncio.gather(*loops)


async def _observe_loop(
    forecaster: WorkloadForecaster,
    *,
    context: ServiceContext,
    interval_s: float,
    gate: Callable[[], bool],
) -> None:
    subject = DEMAND_OBSERVED.at(namespace=forecaster.spec.namespace, workload=forecaster.spec.name)
    clock = forecaster.clock
    while not context.stopping.is_set():
        started = clock.now()
        try:
            event = await forecaster.observe()
            if event is not None and gate():
                await context.bus.publish(subject, event)
        except Exception:
            log.exception("%s: observing demand failed", forecaster.label)
        await wait_for_event(clock, context.stopping, interval_s - (clock.now() - started))


main = service_main("predictor", PredictorSettings, serve)
