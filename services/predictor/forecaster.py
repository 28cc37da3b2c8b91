"""One workload's forecasting I/O for the predictor service (`service.py`): it queries the
workload's demand, lets `WorkloadModel` (`forecasting.py`) decide what to keep, refit and
widen, and turns the model's forecast and the latest demand into events; and the per-workload
metrics it counts."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import string
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime

from prometheus_client import Counter, Gauge, Histogram

from tideshift.events.models import (
    QUANTILE_LEVELS,
    DemandObserved,
    ForecastIssued,
    ForecastPoint,
    WorkloadRef,
)
from tideshift.services.common.clock import Clock
from tideshift.services.predictor.core.calibration import JUDGED_LEVEL, Calibration
from tideshift.services.predictor.core.forecasting import WorkloadModel
from tideshift.services.predictor.core.models import Forecast
from tideshift.services.predictor.settings import PredictorSettings, WorkloadQuery
from tideshift.services.predictor.sources import MetricSource, MetricSourceError, Samples

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
COVERAGE = Gauge(
    "tideshift_predictor_coverage",
    "share of the workload's recent steps whose demand stayed within each forecast quantile",
    ["workload", "quantile"],
)
UNTRUSTED = Gauge(
    "tideshift_predictor_untrusted",
    "1 while a workload's forecasts miss too often to be trusted (coverage_window_steps)",
    ["workload"],
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
    sets += [(metric, (label,)) for metric in (SOURCE_FAILURES, FIT_SECONDS, STALE, UNTRUSTED)]
    sets += [(COVERAGE, (label, f"{level:g}")) for level in QUANTILE_LEVELS]
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
    # Shared by a fleet: how many fits may run at once (None: no limit).
    fits: asyncio.Semaphore | None = None
    state: WorkloadModel = field(init=False)
    calibration: Calibration = field(init=False)

    def __post_init__(self) -> None:
        self.state = WorkloadModel(
            cadence=self.settings.cadence(),
            model_name=self.spec.model or self.settings.model,
            model_settings=self.spec.model_settings,
        )
        self.calibration = Calibration(
            step_s=self.settings.step_seconds, rules=self.settings.calibration_rules()
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
            if reason is None and state.outage_since is not None:
                # Samples from before the outage (a restarted Prometheus answers from its WAL
                # before it scrapes again) do not end it: only history within stale_after of
                # now does, or the outage is logged over again each time late ones arrive.
                reason = state.unusable(fresh=0, end=end)
            if reason is not None:
                raise MetricSourceError(reason)
            if fresh:
                self._score(fresh)
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
        # Fitting takes up to seconds of CPU: off the event loop, so NATS stays served; and
        # a few at a time, so a burst of announced workloads does not starve the loop of the
        # GIL (its subscription overflowed) nor hold every new model's working set at once.
        async with self.fits or contextlib.nullcontext():
            started = time.perf_counter()
            await asyncio.to_thread(model.fit, state.timestamps.copy(), state.values.copy())
            FIT_SECONDS.labels(self.label).observe(time.perf_counter() - started)
        state.adopt(model, now=now)

    def _score(self, fresh: int) -> None:
        """Score the forecasts issued for the steps that just arrived; log a change of trust."""
        calibration = self.calibration
        was_trusted = calibration.trusted
        calibration.observe(self.state.timestamps[-fresh:], self.state.values[-fresh:])
        reason = calibration.judge()
        for level in QUANTILE_LEVELS:
            coverage = calibration.coverage(level)
            if coverage is not None:
                COVERAGE.labels(self.label, f"{level:g}").set(coverage)
        UNTRUSTED.labels(self.label).set(0 if calibration.trusted else 1)
        if was_trusted and reason is not None:
            log.warning(
                "%s: forecasts no longer trusted: %s; the planner sizes on observed demand",
                self.label,
                reason,
            )
        elif not was_trusted and calibration.trusted:
            log.info(
                "%s: forecasts trusted again (q%g coverage %.0f%%)",
                self.label,
                JUDGED_LEVEL,
                100 * (calibration.coverage() or 0.0),
            )

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
        if not stale:  # a widened stale forecast is not what the model claimed
            self.calibration.record(forecast.timestamps, forecast.quantiles)
        FORECASTS.labels(self.label, str(stale).lower()).inc()
        return ForecastIssued(
            workload=self.ref,
            issued_at=datetime.fromtimestamp(now, tz=UTC),
            step_seconds=self.settings.step_seconds,
            model=state.model_name,
            points=_points(forecast),
            stale=stale,
            stale_reason=state.outage_reason,
            # Sent only once known: a reader one release older does not know them (codec.py).
            **_honesty(self.calibration),
        )


def _points(forecast: Forecast) -> tuple[ForecastPoint, ...]:
    return tuple(
        ForecastPoint.of(
            datetime.fromtimestamp(float(at), tz=UTC),
            float(forecast.point[index]),
            {level: float(forecast.quantiles[level][index]) for level in QUANTILE_LEVELS},
        )
        for index, at in enumerate(forecast.timestamps)
    )


def _honesty(calibration: Calibration) -> dict[str, float | str]:
    """The forecast-honesty fields of a forecast event, those that are known."""
    fields: dict[str, float | str] = {}
    coverage = calibration.coverage()
    if coverage is not None:
        fields["coverage"] = coverage
    if reason := calibration.untrusted_reason():
        fields["untrusted_reason"] = reason
    return fields
