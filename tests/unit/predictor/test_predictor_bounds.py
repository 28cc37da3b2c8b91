"""The predictor's memory is bounded by its settings, not by the names and times it is fed
(issue 25 parts 3 and 4): announced workloads are capped, a removed one leaves no metric label
behind, and samples stamped in the future are not trusted."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime

import numpy as np
from prometheus_client import REGISTRY

from tideshift.events import Resources, ServingPolicy, WorkloadChanged, WorkloadRef
from tideshift.services.common.runtime import ServiceContext
from tideshift.services.predictor.service import Fleet, WorkloadForecaster
from tideshift.services.predictor.settings import PredictorSettings, WorkloadQuery
from tideshift.services.predictor.sources import Samples

NOW = 1_800_000_000.0


class FixedClock:
    def now(self) -> float:
        return NOW


class FutureSource:
    """A day of steady demand, plus one reading stamped a year ahead of the clock."""

    async def range(self, query: str, *, start: float, end: float, step_s: float) -> Samples:
        times = np.arange(end - 86400.0, end + 1e-6, step_s)
        times = np.append(times, end + 365 * 86400.0)
        return Samples(times, np.full(times.shape, 50.0))

    async def latest(self, query: str, *, at: float) -> float | None:
        return 50.0


def settings(**overrides: object) -> PredictorSettings:
    values: dict[str, object] = {
        "step_seconds": 60.0,
        "horizon_seconds": 600.0,
        "history_seconds": 86400.0,
        "model": "tidal",
        "health_port": -1,
    }
    values.update(overrides)
    return PredictorSettings(**values)  # type: ignore[arg-type]


def announcement(name: str, change: str = "added") -> WorkloadChanged:
    return WorkloadChanged(
        change=change,  # type: ignore[arg-type]
        workload=WorkloadRef(namespace="shop", kind="Deployment", name=name),
        role="serving",
        replicas=1,
        requests=Resources(cpu=0.1),
        serving=ServingPolicy(capacity_rps=10),
        observed_at=datetime.now(UTC),
    )


def skipped() -> float:
    value = REGISTRY.get_sample_value("tideshift_predictor_announcements_skipped_total")
    return value or 0.0


async def test_future_stamped_samples_are_dropped_and_counted() -> None:
    config = settings()
    spec = WorkloadQuery(namespace="shop", name="web")
    forecaster = WorkloadForecaster(
        spec=spec, settings=config, source=FutureSource(), clock=FixedClock()
    )
    before = REGISTRY.get_sample_value("tideshift_predictor_future_samples_total") or 0.0
    event = await forecaster.tick()
    assert event is not None
    covered = forecaster.state.covered_until
    assert covered is not None and covered <= NOW + config.max_clock_skew_seconds
    after = REGISTRY.get_sample_value("tideshift_predictor_future_samples_total")
    assert after == before + 1


async def test_announced_workloads_are_capped_and_a_removal_makes_room() -> None:
    config = settings(max_announced_workloads=2, metric_source="sim")
    context = ServiceContext(name="predictor", settings=config, bus=None, instance="t")  # type: ignore[arg-type]
    context.stopping.set()  # the loops end at once: which ones start is under test
    fleet = Fleet(config, context, clock=FixedClock(), source=FutureSource())
    before = skipped()
    for name in ("a", "b", "c", "d"):
        fleet.apply(announcement(name))
    assert sorted(ref.name for ref in fleet.loops) == ["a", "b"]
    assert skipped() == before + 2
    await asyncio.sleep(0)  # the started loops run (and end: stopping is set)
    fleet.apply(announcement("a", change="deleted"))
    fleet.apply(announcement("c"))
    assert sorted(ref.name for ref in fleet.loops) == ["b", "c"]
    await asyncio.sleep(0)
    await fleet.stop_all()


async def test_a_removed_workload_leaves_no_metric_labels() -> None:
    config = settings(metric_source="sim", observe_seconds=0)
    context = ServiceContext(name="predictor", settings=config, bus=None, instance="t")  # type: ignore[arg-type]
    context.stopping.set()
    fleet = Fleet(config, context, clock=FixedClock(), source=FutureSource())
    fleet.apply(announcement("gone"))
    await asyncio.sleep(0)
    spec, _ = fleet.loops[WorkloadRef(namespace="shop", kind="Deployment", name="gone")]
    forecaster = WorkloadForecaster(
        spec=spec, settings=config, source=FutureSource(), clock=FixedClock()
    )
    assert await forecaster.tick() is not None
    labels = {"workload": "shop/gone", "stale": "false"}
    assert REGISTRY.get_sample_value("tideshift_predictor_forecasts_total", labels) == 1.0
    fleet.apply(announcement("gone", change="deleted"))
    assert REGISTRY.get_sample_value("tideshift_predictor_forecasts_total", labels) is None
    await fleet.stop_all()
