"""The predictor's forecasting decisions, one copy for the service and `tideshift simulate`:
which samples to ask for and keep, when to refit, which forecast steps are already past and
how far a stale forecast widens. Pure: time is an argument; it does no I/O, reads no clock and
imports no asyncio, nats, kubernetes or services.common."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime

import numpy as np

from tideshift.services.predictor.core.models import MODELS, Forecast, Forecaster, build_model
from tideshift.services.predictor.core.models.base import FloatArray

# The defaults of the predictor's settings, and what `simulate` forecasts with.
REFIT_S = 3600.0
STALE_AFTER_S = 180.0
STALE_WIDENING = 0.25
STALE_WIDENING_PER_HOUR = 0.5
# A stale forecast's upper quantiles grow at most to (1 + this) x the model's.
MAX_STALE_WIDENING = 2.0
# Quantiles a stale forecast widens; q0.5 stays the model's best guess.
WIDENED_LEVELS = (0.9, 0.95, 0.99)


@dataclass(frozen=True)
class Cadence:
    """The sample grid, how far forecasts reach, and the refit and staleness rules (seconds)."""

    step_s: float
    horizon_s: float
    history_s: float
    refit_s: float = REFIT_S
    stale_after_s: float = STALE_AFTER_S
    stale_widening: float = STALE_WIDENING
    stale_widening_per_hour: float = STALE_WIDENING_PER_HOUR


def build_forecaster(
    model_name: str, cadence: Cadence, settings: Mapping[str, object] | None = None
) -> Forecaster:
    """A fresh registry model on the cadence's grid and horizon; `settings` override both."""
    overrides: dict[str, object] = {"default_interval_s": cadence.step_s}
    if "max_horizon_s" in MODELS[model_name].config_type.model_fields:
        overrides["max_horizon_s"] = cadence.horizon_s
    overrides.update(settings or {})
    return build_model(model_name, overrides)


def warm_up(model_name: str, cadence: Cadence) -> Forecast:
    """Fit and run the model once on two hours of a made-up hourly wave, so the libraries it
    loads on first use (statsforecast, statsmodels: some 45 MB, seconds of imports) are
    loaded at start-up: the first workload's forecast does not wait for them, and the memory
    they hold is the service's baseline, not something the first workloads seem to leave."""
    times = np.arange(0.0, 2 * 3600.0, cadence.step_s)
    values = 100.0 + 10.0 * np.sin(2 * np.pi * times / 3600.0)
    model = build_forecaster(model_name, cadence)
    model.fit(times, values)
    return model.predict(1)


def widening(cadence: Cadence, *, outage_s: float) -> float:
    """How much a forecast `outage_s` seconds into an outage widens its upper quantiles."""
    return min(
        MAX_STALE_WIDENING,
        cadence.stale_widening + cadence.stale_widening_per_hour * outage_s / 3600.0,
    )


def published(forecast: Forecast, *, first: int, widen_by: float) -> Forecast:
    """The forecast from step `first` on, its upper quantiles x (1 + `widen_by`), never
    below q0.5."""
    q50 = forecast.quantiles[0.5][first:]
    quantiles = {
        level: np.maximum(q50, values[first:] * (1.0 + widen_by))
        if level in WIDENED_LEVELS
        else values[first:]
        for level, values in forecast.quantiles.items()
    }
    return Forecast(
        timestamps=forecast.timestamps[first:],
        point=forecast.point[first:],
        quantiles=quantiles,
        interval_s=forecast.interval_s,
    )


def grid(start: float, end: float, step_s: float) -> FloatArray:
    """The sample times a range query over [start, end] answers: whole steps."""
    first = math.ceil(start / step_s - 1e-9) * step_s
    if first > end:
        return _empty()
    return np.arange(first, end + step_s * 1e-6, step_s)


def _empty() -> FloatArray:
    return np.zeros(0)


@dataclass
class WorkloadModel:
    """One workload's kept history, fitted model and outage, and the decisions on them."""

    cadence: Cadence
    model_name: str
    model_settings: Mapping[str, object] = field(default_factory=dict)
    model: Forecaster | None = None
    timestamps: FloatArray = field(default_factory=_empty)
    values: FloatArray = field(default_factory=_empty)
    last_fit_at: float | None = None
    outage_since: float | None = None
    outage_reason: str = ""
    # The last outage that ended, and when: a relapse soon after continues it.
    last_outage: tuple[float, float] | None = None

    @property
    def newest(self) -> float | None:
        """The start of the newest interval the history holds."""
        return float(self.timestamps[-1]) if self.timestamps.shape[0] else None

    @property
    def covered_until(self) -> float | None:
        """The end of the newest interval the history holds: the newest query's stamp."""
        newest = self.newest
        return None if newest is None else newest + self.cadence.step_s

    def window(self, now: float) -> tuple[float, float]:
        """The samples to ask for at `now`: the whole history at first, then only the new
        steps, up to the last whole step."""
        step = self.cadence.step_s
        end = math.floor(now / step) * step
        covered = self.covered_until
        start = end - self.cadence.history_s if covered is None else covered + step
        return min(start, end), end

    def absorb(self, times: FloatArray, values: FloatArray) -> int:
        """Keep the valid samples (finite, >= 0) newer than the history, within
        `history_s` of the newest; returns how many were new.

        A rate query stamped t measures the step before t, and a forecast's value at t holds
        for the step after t (as the planner reads it): each sample is kept at the start of
        the step it measures, or every forecast would run one step late."""
        times = times - self.cadence.step_s
        keep = np.isfinite(times) & np.isfinite(values) & (values >= 0)
        newest = self.newest
        if newest is not None:
            keep &= times > newest
        times, values = times[keep], values[keep]
        if not times.shape[0]:
            return 0
        horizon_start = float(times[-1]) - self.cadence.history_s
        self.timestamps = np.concatenate([self.timestamps, times])
        self.values = np.concatenate([self.values, values])
        recent = self.timestamps > horizon_start
        self.timestamps, self.values = self.timestamps[recent], self.values[recent]
        return int(times.shape[0])

    def take(self, times: FloatArray, values: FloatArray, *, end: float) -> tuple[int, str | None]:
        """`absorb` the answer to the query up to `end`: how many samples were new, and
        why the history cannot be trusted (`unusable`), None when it can."""
        fresh = self.absorb(times, values)
        return fresh, self.unusable(fresh=fresh, end=end)

    def unusable(self, *, fresh: int, end: float) -> str | None:
        """Why the history cannot be trusted at `end` (nothing yet, or no new sample for
        `stale_after_s`); None when it can."""
        covered = self.covered_until
        if covered is None:
            return "no usable samples (empty, NaN or negative)"
        if not fresh and end - covered > self.cadence.stale_after_s:
            since = datetime.fromtimestamp(covered, tz=UTC).isoformat(timespec="seconds")
            return f"no usable samples (empty, NaN or negative) since {since}"
        return None

    def refit_due(self, now: float) -> bool:
        return (
            self.model is None
            or self.last_fit_at is None
            or now - self.last_fit_at >= self.cadence.refit_s
        )

    def next_model(self, *, fresh: int, now: float) -> Forecaster | None:
        """A new model to fit on the history when a refit is due (the caller fits it, then
        `adopt`s it); otherwise the current model takes the `fresh` samples and None."""
        if self.refit_due(now):
            return build_forecaster(self.model_name, self.cadence, self.model_settings)
        assert self.model is not None  # refit_due is True without one
        self.model.update(self.timestamps[-fresh:], self.values[-fresh:])
        return None

    def adopt(self, model: Forecaster, *, now: float) -> None:
        self.model = model
        self.last_fit_at = now

    def learn(self, *, fresh: int, now: float) -> None:
        """Refit or update in place (callers that may block while fitting)."""
        model = self.next_model(fresh=fresh, now=now)
        if model is not None:
            model.fit(self.timestamps.copy(), self.values.copy())
            self.adopt(model, now=now)

    def begin_outage(self, *, now: float, reason: str) -> bool:
        """Mark the forecast stale; True when this starts an outage (log it once).

        A relapse within `stale_after_s` of a recovery (a restarted source answers from
        what it had before, then has nothing until it has scraped again) continues the
        outage that just ended: not logged again, and the forecast stays as wide as it was."""
        if self.outage_since is not None:
            return False
        relapse = self.last_outage is not None and (
            now - self.last_outage[1] <= self.cadence.stale_after_s
        )
        self.outage_since = self.last_outage[0] if relapse and self.last_outage else now
        self.outage_reason = reason
        return not relapse

    def end_outage(self, *, now: float) -> float | None:
        """Mark the forecast fresh; how long the outage lasted, None when there was none."""
        if self.outage_since is None:
            return None
        lasted = now - self.outage_since
        self.last_outage = (self.outage_since, now)
        self.outage_since, self.outage_reason = None, ""
        return lasted

    def behind(self, now: float) -> int:
        """The forecast steps already past at `now`: the model's first step starts where
        its history ends."""
        covered = self.covered_until
        return 0 if covered is None else max(0, math.floor((now - covered) / self.cadence.step_s))

    def forecast(self, now: float) -> Forecast | None:
        """The forecast to publish at `now`: from the first step not yet past, widened while
        stale; None before the first fit."""
        if self.model is None or self.newest is None:
            return None
        horizon_steps = max(1, math.ceil(self.cadence.horizon_s / self.cadence.step_s))
        behind = self.behind(now)
        forecast = self.model.predict(horizon_steps + behind)
        stale_for = None if self.outage_since is None else now - self.outage_since
        widen_by = 0.0 if stale_for is None else widening(self.cadence, outage_s=stale_for)
        return published(forecast, first=behind, widen_by=widen_by)
