"""Forecasts for the simulator: the true future (oracle) or the predictor's model, refitted
on the profile's own history as the predictor service would; no clock, no I/O."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from tideshift.loadgen.profiles import RateProfile
from tideshift.services.planner import policy as pol
from tideshift.services.simulator.scenario import Scenario

QUANTILES = (0.5, 0.9, 0.95, 0.99)


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
        return pol.Forecast(issued_at=now, times=times, quantiles={q: values for q in QUANTILES})


@dataclass
class ModelForecaster:
    """The predictor's model, fitted on history before t = 0, updated each interval."""

    profile: RateProfile
    model_name: str
    interval_s: float
    history_s: float
    horizon_s: float
    sample_s: float
    _model: Any = None
    _observed_until: float = 0.0  # start of the next interval to observe
    _cache: tuple[float, pol.Forecast] | None = None

    def _observe(self, start: float) -> float:
        samples = max(1, math.ceil(self.interval_s / self.sample_s))
        return (
            sum(self.profile.rate(start + k * self.interval_s / samples) for k in range(samples))
            / samples
        )

    def _ensure_fitted(self) -> None:
        if self._model is not None:
            return
        from tideshift.services.predictor.models import DEFAULT_MODEL, build_model

        self._model = build_model(self.model_name or DEFAULT_MODEL)
        count = max(2, int(self.history_s // self.interval_s))
        times = np.array([-(count - i) * self.interval_s for i in range(count)])
        values = np.array([self._observe(t) for t in times])
        self._model.fit(times, values)
        self._observed_until = 0.0

    def forecast(self, now: float) -> pol.Forecast:
        self._ensure_fitted()
        new_times = []
        while self._observed_until + self.interval_s <= now + 1e-9:
            new_times.append(self._observed_until)
            self._observed_until += self.interval_s
        if new_times:
            values = [self._observe(t) for t in new_times]
            self._model.update(np.array(new_times), np.array(values))
            self._cache = None
        if self._cache is None:
            steps = max(1, math.ceil(self.horizon_s / self.interval_s))
            predicted = self._model.predict(steps)
            self._cache = (
                now,
                pol.Forecast(
                    issued_at=now,
                    times=tuple(float(t) for t in predicted.timestamps),
                    quantiles={
                        float(q): tuple(float(v) for v in values)
                        for q, values in predicted.quantiles.items()
                    },
                ),
            )
        return self._cache[1]


def make_forecaster(scenario: Scenario, profile: RateProfile) -> SimForecaster:
    spec = scenario.forecaster
    if spec.kind == "oracle":
        return OracleForecaster(profile, spec.interval_s, spec.horizon_s, scenario.step_s)
    return ModelForecaster(
        profile, spec.model or "", spec.interval_s, spec.history_s, spec.horizon_s, scenario.step_s
    )
