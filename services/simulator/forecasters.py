"""Forecasts for the simulator: the true future (oracle) or the predictor's model, fitted,
refitted, updated and widened by the predictor's own decisions (`predictor/core/forecasting.py`)
on the profile's history; no clock, no I/O."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from tideshift.events.models import QUANTILE_LEVELS
from tideshift.loadgen.core.profiles import RateProfile
from tideshift.services.planner import core as pol
from tideshift.services.predictor.core.forecasting import REFIT_S, Cadence, WorkloadModel, grid
from tideshift.services.predictor.core.models import DEFAULT_MODEL, Forecast
from tideshift.services.simulator.scenario import Scenario


class SimForecaster(Protocol):
    def forecast(self, now: float) -> pol.Forecast: ...


@dataclass
class OracleForecaster:
    """The true future: each interval's highest rate (sampled every `sample_s`)."""

    profile: RateProfile
    interval_s: float
    horizon_s: float
    sample_s: float

    def forecast(self, now: float) -> pol.Forecast:
        start = math.floor(now / self.interval_s) * self.interval_s
        steps = max(1, math.ceil(self.horizon_s / self.interval_s))
        times = tuple(start + i * self.interval_s for i in range(steps))
        per_interval = max(1, math.ceil(self.interval_s / self.sample_s))
        values = tuple(
            max(
                self.profile.rate(t + k * self.interval_s / per_interval)
                for k in range(per_interval)
            )
            for t in times
        )
        return pol.Forecast(
            issued_at=now, times=times, quantiles={q: values for q in QUANTILE_LEVELS}
        )


@dataclass
class ModelForecaster:
    """The predictor's model, deciding as the predictor service does
    (`predictor/core/forecasting.py`): fitted on `history_s` before t = 0, refitted every
    `refit_s`, updated with each new sample, and, while the profile gives no usable sample
    (NaN or negative), stale and widened."""

    profile: RateProfile
    model_name: str
    interval_s: float
    history_s: float
    horizon_s: float
    sample_s: float
    refit_s: float = REFIT_S
    _model: WorkloadModel | None = None
    # The forecast last published and what it was made from: (newest sample, fit, steps past).
    _cache: tuple[tuple[float | None, float | None, int], pol.Forecast] | None = None

    def measure(self, end: float) -> float:
        """What a rate query at `end` reports: the mean rate over the interval before it."""
        samples = max(1, math.ceil(self.interval_s / self.sample_s))
        start = end - self.interval_s
        return (
            sum(self.profile.rate(start + k * self.interval_s / samples) for k in range(samples))
            / samples
        )

    @property
    def model(self) -> WorkloadModel:
        if self._model is None:
            cadence = Cadence(
                step_s=self.interval_s,
                horizon_s=self.horizon_s,
                history_s=self.history_s,
                refit_s=self.refit_s,
            )
            self._model = WorkloadModel(cadence, self.model_name or DEFAULT_MODEL)
        return self._model

    def _tick(self, now: float) -> None:
        """One step of the predictor's loop: query, refit or update, mark stale or fresh."""
        model = self.model
        start, end = model.window(now)
        times = grid(start, end, self.interval_s)
        values = np.array([self.measure(float(t)) for t in times], dtype=np.float64)
        fresh, reason = model.take(times, values, end=end)
        if reason is not None:
            model.begin_outage(now=now, reason=reason)
            return
        if fresh:
            model.learn(fresh=fresh, now=now)
        model.end_outage(now=now)

    def forecast(self, now: float) -> pol.Forecast:
        self._tick(now)
        model = self.model
        made_from = (model.newest, model.last_fit_at, model.behind(now))
        stale = model.outage_since is not None
        if stale or self._cache is None or self._cache[0] != made_from:
            predicted = model.forecast(now)
            self._cache = (made_from, _policy_forecast(predicted, now=now))
        return self._cache[1]


def _policy_forecast(predicted: Forecast | None, *, now: float) -> pol.Forecast:
    if predicted is None:  # nothing usable yet: no forecast in force
        return pol.Forecast(issued_at=now, times=(), quantiles={})
    return pol.Forecast(
        issued_at=now,
        times=tuple(float(t) for t in predicted.timestamps),
        quantiles={
            float(q): tuple(float(v) for v in values) for q, values in predicted.quantiles.items()
        },
    )


def make_forecaster(scenario: Scenario, profile: RateProfile) -> SimForecaster:
    spec = scenario.forecaster
    if spec.kind == "oracle":
        return OracleForecaster(profile, spec.interval_s, spec.horizon_s, scenario.step_s)
    return ModelForecaster(
        profile, spec.model or "", spec.interval_s, spec.history_s, spec.horizon_s, scenario.step_s
    )
