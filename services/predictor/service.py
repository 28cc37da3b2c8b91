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
This module does the I/O and the loops; what to keep, refit and widen is decided in
`forecasting.py` (shared with `tideshift simulate`), the settings are in `settings.py`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import string
import time
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from functools import partial
from typing import Any

from prometheus_client import Counter, Gauge, Histogram

from tideshift.events.models import (
    DemandObserved,
    ForecastIssued,
    ForecastPoint,
    WorkloadChanged,
    WorkloadRef,
)
from tideshift.events.subjects import DEMAND_OBSERVED, FORECAST, WORKLOAD_CHANGED
from tideshift.services.common.bus import follow
from tideshift.services.common.clock import Clock, WallClock, wait_for_event
from tideshift.services.common.runtime import ServiceContext, run_service
from tideshift.services.common.settings import parse_settings
from tideshift.services.predictor.forecasting import WorkloadModel
from tideshift.services.predictor.models import Forecast
from tideshift.services.predictor.settings import PredictorSettings, WorkloadQuery
from tideshift.services.predictor.sources import (
    MetricSource,
    MetricSourceError,
    PrometheusSource,
    Samples,
    SimMetricSource,
)

log = logging.getLogger("tideshift.predictor")


FORECASTS = Counter(
    "tideshift_predictor_forecasts_total", "forecasts published", ["workload", "stale"]
)
SOURCE_FAILURES = Counter(
    "tideshift_predictor_source_failures_total", "failed or empty metric queries", ["workload"]
)
FIT_SECONDS = Histogram("tideshift_predictor_fit_seconds", "model refit time", ["workload"])
OBSERVATIONS = Counter(
    "tideshift_predictor_observations_total",
    "observed demand: published, or skipped (no sample, NaN, negative, source failing)",
    ["workload", "outcome"],
)
STALE = Gauge("tideshift_predictor_stale", "1 while a workload's forecast is stale", ["workload"])
REFUSED = Counter(
    "tideshift_predictor_announcements_skipped_total",
    "announced workloads not forecast: max_announced_workloads reached",
)
FUTURE_SAMPLES = Counter(
    "tideshift_predictor_future_samples_total",
    "samples dropped: stamped further ahead of the clock than max_clock_skew_seconds",
)


def forget_metrics(label: str) -> None:
    """Drop a removed workload's label sets, so metrics do not grow with names seen once."""
    sets: list[tuple[Counter | Gauge | Histogram, tuple[str, ...]]]
    sets = [(FORECASTS, (label, stale)) for stale in ("true", "false")]
    sets += [(OBSERVATIONS, (label, o)) for o in ("published", "unusable", "source_failing")]
    sets += [(metric, (label,)) for metric in (SOURCE_FAILURES, FIT_SECONDS, STALE)]
    for metric, labels in sets:
        with contextlib.suppress(KeyError):  # never set for this workload
            metric.remove(*labels)


@dataclass
class WorkloadForecaster:
    """One workload's forecasting I/O: queries its demand and publishes what `WorkloadModel`
    (`forecasting.py`) decides; `tick` makes one step's forecast."""

    spec: WorkloadQuery
    settings: PredictorSettings
    source: MetricSource
    clock: Clock
    state: WorkloadModel = field(init=False)

    def __post_init__(self) -> None:
        self.state = WorkloadModel(
            cadence=self.settings.cadence(),
            model_name=self.spec.model or self.settings.model,
            model_settings=self.spec.model_settings,
        )

    @property
    def label(self) -> str:
        return f"{self.spec.namespace}/{self.spec.name}"

    @property
    def query(self) -> str:
        template = self.spec.query or self.settings.query_template
        return string.Template(template).safe_substitute(
            name=self.spec.name, namespace=self.spec.namespace
        )

    @property
    def ref(self) -> WorkloadRef:
        return WorkloadRef(kind=self.spec.kind, namespace=self.spec.namespace, name=self.spec.name)

    async def tick(self) -> ForecastIssued | None:
        """Query, fit or update, forecast. None when there is nothing to forecast from yet."""
        state = self.state
        now = self.clock.now()
        start, end = state.window(now)
        try:
            samples = self._trusted(await self._fetch(start=start, end=end), now=now)
            fresh, reason = state.take(samples.timestamps, samples.values, end=end)
            if reason is not None:
                raise MetricSourceError(reason)
            if fresh:
                await self._learn(fresh, now=now)
        except MetricSourceError as error:
            SOURCE_FAILURES.labels(self.label).inc()
            return self._stale(now=now, reason=str(error))
        lasted = state.end_outage(now=now)
        if lasted is not None:
            log.info(
                "%s: metrics are back after %.0f s; forecasts are fresh again", self.label, lasted
            )
        STALE.labels(self.label).set(0)  # 0, not absent, while fresh: alerts see the series
        return self._issue(now=now)

    async def observe(self) -> DemandObserved | None:
        """The demand measured now; None (counted) when the source has no usable value."""
        now = self.clock.now()
        try:
            rps = await asyncio.wait_for(
                self.source.latest(self.query, at=now), self.settings.query_timeout_seconds + 1.0
            )
        except (MetricSourceError, TimeoutError):
            # The forecast loop logs the outage once; here it is only counted.
            OBSERVATIONS.labels(self.label, "source_failing").inc()
            return None
        if rps is None or not math.isfinite(rps) or rps < 0:
            OBSERVATIONS.labels(self.label, "unusable").inc()
            return None
        OBSERVATIONS.labels(self.label, "published").inc()
        return DemandObserved(
            workload=self.ref, rps=rps, observed_at=datetime.fromtimestamp(now, tz=UTC)
        )

    async def _fetch(self, *, start: float, end: float) -> Samples:
        try:
            return await asyncio.wait_for(
                self.source.range(
                    self.query, start=start, end=end, step_s=self.settings.step_seconds
                ),
                self.settings.query_timeout_seconds + 1.0,
            )
        except TimeoutError:
            raise MetricSourceError(
                f"no answer within {self.settings.query_timeout_seconds:g} s"
            ) from None

    def _trusted(self, samples: Samples, *, now: float) -> Samples:
        """Without future-stamped samples: one would outrank every true reading after it."""
        keep = samples.timestamps <= now + self.settings.max_clock_skew_seconds
        if keep.all():
            return samples
        FUTURE_SAMPLES.inc(int((~keep).sum()))
        return Samples(samples.timestamps[keep], samples.values[keep])

    async def _learn(self, fresh: int, *, now: float) -> None:
        state = self.state
        model = state.next_model(fresh=fresh, now=now)
        if model is None:
            return
        started = time.perf_counter()
        # Fitting takes up to seconds of CPU: off the event loop, so NATS stays served.
        await asyncio.to_thread(model.fit, state.timestamps.copy(), state.values.copy())
        FIT_SECONDS.labels(self.label).observe(time.perf_counter() - started)
        state.adopt(model, now=now)

    def _stale(self, *, now: float, reason: str) -> ForecastIssued | None:
        if self.state.begin_outage(now=now, reason=reason):
            STALE.labels(self.label).set(1)
            log.warning(
                "%s: metric source failing (%s); publishing the last forecast marked stale "
                "until it recovers",
                self.label,
                reason,
            )
        return self._issue(now=now)

    def _issue(self, *, now: float) -> ForecastIssued | None:
        state = self.state
        forecast = state.forecast(now)
        if forecast is None:
            return None
        stale = state.outage_since is not None
        FORECASTS.labels(self.label, str(stale).lower()).inc()
        return ForecastIssued(
            workload=self.ref,
            issued_at=datetime.fromtimestamp(now, tz=UTC),
            step_seconds=self.settings.step_seconds,
            model=state.model_name,
            points=_points(forecast),
            stale=stale,
            stale_reason=state.outage_reason,
        )


def _points(forecast: Forecast) -> tuple[ForecastPoint, ...]:
    return tuple(
        ForecastPoint(
            at=datetime.fromtimestamp(float(at), tz=UTC),
            point=float(forecast.point[index]),
            q50=float(forecast.quantiles[0.5][index]),
            q90=float(forecast.quantiles[0.9][index]),
            q95=float(forecast.quantiles[0.95][index]),
            q99=float(forecast.quantiles[0.99][index]),
        )
        for index, at in enumerate(forecast.timestamps)
    )


def build_source(settings: PredictorSettings) -> MetricSource:
    if settings.metric_source == "sim":
        from tideshift.loadgen.profiles import DiurnalProfile

        profile = DiurnalProfile(peak_rps=settings.sim_peak_rps, trough_rps=settings.sim_trough_rps)
        return SimMetricSource(profile.rate)
    return PrometheusSource(settings.prometheus_url, timeout_s=settings.query_timeout_seconds)


async def run(
    settings: PredictorSettings,
    context: ServiceContext,
    *,
    clock: Clock | None = None,
    source: MetricSource | None = None,
    on_forecast: Callable[[ForecastIssued], Awaitable[None]] | None = None,
) -> None:
    """The service body: one forecasting loop per workload until `context.stopping`."""
    fleet = Fleet(
        settings,
        context,
        clock=clock or WallClock(),
        source=source or build_source(settings),
        on_forecast=on_forecast,
    )
    for spec in settings.workloads:
        fleet.start(spec)
    follower = asyncio.create_task(fleet.follow())
    try:
        await fleet.bootstrap()
        context.ready.set()
        await context.stopping.wait()
    finally:
        follower.cancel()
        await fleet.stop_all()


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
    loops: dict[WorkloadRef, tuple[WorkloadQuery, asyncio.Task[None]]] = field(default_factory=dict)
    static: set[WorkloadRef] = field(default_factory=set)
    full: bool = False  # the announced-workload cap was reached (logged once per episode)

    def _announced_count(self) -> int:
        return len(self.loops) - len(self.static & self.loops.keys())

    def start(self, spec: WorkloadQuery, *, announced: bool = False) -> None:
        ref = WorkloadRef(spec.namespace, spec.kind, spec.name)
        if not announced:
            self.static.add(ref)
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
            spec=spec, settings=self.settings, source=self.source, clock=self.clock
        )
        loops = [
            _loop(
                forecaster,
                context=self.context,
                interval_s=self.settings.refresh_seconds or self.settings.step_seconds,
                on_forecast=self.on_forecast,
            )
        ]
        if self.settings.observe_seconds > 0:
            loops.append(
                _observe_loop(
                    forecaster, context=self.context, interval_s=self.settings.observe_seconds
                )
            )
        task = asyncio.create_task(_all(loops))
        self.loops[ref] = (spec, task)
        log.info("%s: forecasting (%s)", ref, "announced" if announced else "settings")

    def apply(self, event: WorkloadChanged) -> None:
        ref = event.workload
        if event.role != "serving" or ref in self.static:
            return
        if event.change == "deleted":
            running = self.loops.pop(ref, None)
            if running is not None:
                running[1].cancel()
                forget_metrics(f"{ref.namespace}/{ref.name}")
                self.full = False
                log.info("%s: removed; no longer forecast", ref)
            return
        self.start(_spec_of(event), announced=True)

    async def follow(self) -> None:
        """Apply the watcher's workload announcements until the service stops."""
        await follow(
            lambda: self.context.bus.subscribe(WORKLOAD_CHANGED.filter(), consumer="predictor"),
            lambda envelope: self.apply(envelope.data),
            clock=self.clock,
            stopping=self.context.stopping,
            name="workload announcements",
        )

    async def bootstrap(self) -> None:
        """The workloads announced before this predictor started, from the snapshot."""
        try:
            kv = await self.context.bus.kv(self.settings.snapshot_bucket)
            for key in await kv.keys():
                if key.startswith("workload."):
                    event = await kv.get(key, WorkloadChanged)
                    if event is not None:
                        self.apply(event)
        except Exception as error:  # no snapshot yet: live announcements only
            log.warning("no workloads from %s: %s", self.settings.snapshot_bucket, error)

    async def stop_all(self) -> None:
        tasks = [task for _, task in self.loops.values()]
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
) -> None:
    subject = FORECAST.at(namespace=forecaster.spec.namespace, workload=forecaster.spec.name)
    published = False
    clock = forecaster.clock
    while not context.stopping.is_set():
        started = clock.now()
        try:
            event = await forecaster.tick()
            if event is not None:
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
    forecaster: WorkloadForecaster, *, context: ServiceContext, interval_s: float
) -> None:
    subject = DEMAND_OBSERVED.at(namespace=forecaster.spec.namespace, workload=forecaster.spec.name)
    clock = forecaster.clock
    while not context.stopping.is_set():
        started = clock.now()
        try:
            event = await forecaster.observe()
            if event is not None:
                await context.bus.publish(subject, event)
        except Exception:
            log.exception("%s: observing demand failed", forecaster.label)
        await wait_for_event(clock, context.stopping, interval_s - (clock.now() - started))


def main(argv: Sequence[str]) -> int:
    settings = parse_settings(PredictorSettings, argv, prog="tideshift run predictor")
    return run_service("predictor", settings, partial(run, settings))
