"""`simulate`'s model forecaster decides as the predictor service does: the same refits on
the same cadence, the same forecasts, widened the same way while samples are unusable."""

from __future__ import annotations

import math
from dataclasses import dataclass

import pytest

from tideshift.services.predictor.service import WorkloadForecaster
from tideshift.services.predictor.settings import PredictorSettings
from tideshift.services.predictor.sources import SimMetricSource
from tideshift.services.simulator.forecasters import ModelForecaster

DAY = 86400.0
OUTAGE = (2 * 3600.0, 2 * 3600.0 + 1200.0)  # profile times the traffic source gives NaN


@dataclass(frozen=True)
class GappyProfile:
    def rate(self, t: float) -> float:
        if OUTAGE[0] <= t < OUTAGE[1]:
            return math.nan
        return 100 + 50 * math.sin(2 * math.pi * t / DAY)


class SteppedClock:
    def __init__(self, now: float) -> None:
        self.value = now

    def now(self) -> float:
        return self.value


async def test_simulator_refits_and_widens_exactly_as_the_predictor() -> None:
    simulated = ModelForecaster(
        GappyProfile(),
        "seasonal_naive_daily",
        interval_s=60.0,
        history_s=DAY,
        horizon_s=600.0,
        sample_s=5.0,
        refit_s=1800.0,
    )
    settings = PredictorSettings(
        workloads=[{"namespace": "shop", "name": "web"}],
        model="seasonal_naive_daily",
        step_seconds=60.0,
        horizon_seconds=600.0,
        history_seconds=DAY,
        refit_seconds=1800.0,
        health_port=-1,
    )
    clock = SteppedClock(0.0)
    # The predictor reads the same measurements: the mean rate over the step before each time.
    production = WorkloadForecaster(
        spec=settings.workloads[0],
        settings=settings,
        source=SimMetricSource(simulated.measure),
        clock=clock,
    )
    refits: list[tuple[float | None, float | None]] = []
    stale_seen = 0
    for minute in range(4 * 60):
        clock.value = 60.0 * minute + 7.0
        issued = await production.tick()
        forecast = simulated.forecast(clock.value)
        assert issued is not None
        refits.append((production.state.last_fit_at, simulated.model.last_fit_at))
        assert [p.at.timestamp() for p in issued.points] == list(forecast.times)
        assert [p.q95 for p in issued.points] == pytest.approx(forecast.quantiles[0.95])
        assert [p.q50 for p in issued.points] == pytest.approx(forecast.quantiles[0.5])
        assert issued.stale == (simulated.model.outage_since is not None)
        stale_seen += issued.stale
    fits = sorted({fit for fit, _ in refits if fit is not None})
    assert all(ours == theirs for ours, theirs in refits)
    assert len(fits) >= 7  # refitted every 30 min, not only once before t = 0
    assert stale_seen >= 10  # the outage was stale (and widened) in both
