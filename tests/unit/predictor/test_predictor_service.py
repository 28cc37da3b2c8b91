"""The predictor's per-workload loop against fake metric sources and a stepped clock."""

from __future__ import annotations

import asyncio
import logging
import math

import numpy as np
import pytest

from tideshift.services.predictor.service import WorkloadForecaster
from tideshift.services.predictor.settings import PredictorSettings, WorkloadQuery
from tideshift.services.predictor.sources import (
    MetricSourceError,
    Samples,
    SimMetricSource,
    parse_matrix,
    parse_vector,
)

START = 1_699_999_980.0  # a multiple of 60: steps land on whole minutes


class SteppedClock:
    def __init__(self, now: float) -> None:
        self.value = now

    def now(self) -> float:
        return self.value


class ScriptedSource:
    """A diurnal rate, or a failure mode chosen by the test."""

    def __init__(self) -> None:
        self.mode = "ok"
        self.queries: list[str] = []
        self.never = asyncio.Event()

    async def range(self, query: str, *, start: float, end: float, step_s: float) -> Samples:
        self.queries.append(query)
        if self.mode == "down":
            raise MetricSourceError("connection refused")
        if self.mode == "slow":
            await self.never.wait()
        times = np.arange(math.ceil(start / step_s) * step_s, end + 1e-6, step_s)
        if self.mode == "nan":
            return Samples(times, np.full(times.shape, np.nan))
        if self.mode == "empty":
            return Samples.empty()
        return Samples(times, 100 + 50 * np.sin(2 * np.pi * times / 86400))

    async def latest(self, query: str, *, at: float) -> float | None:
        self.queries.append(query)
        if self.mode == "down":
            raise MetricSourceError("connection refused")
        if self.mode == "slow":
            await self.never.wait()
        return {"nan": math.nan, "empty": None, "negative": -3.0}.get(self.mode, 120.0)


def settings(**overrides) -> PredictorSettings:
    values = {
        "workloads": [{"namespace": "shop", "name": "web"}],
        "step_seconds": 60.0,
        "horizon_seconds": 600.0,
        "history_seconds": 3 * 86400.0,
        "refit_seconds": 3600.0,
        "query_timeout_seconds": 0.05,
        "stale_after_seconds": 180.0,
        "health_port": -1,
    }
    values.update(overrides)
    return PredictorSettings(**values)


def forecaster(source, clock, **overrides) -> WorkloadForecaster:
    config = settings(**overrides)
    return WorkloadForecaster(spec=config.workloads[0], settings=config, source=source, clock=clock)


async def test_healthy_source_gives_fresh_forecasts_over_the_horizon() -> None:
    source, clock = ScriptedSource(), SteppedClock(START)
    loop = forecaster(source, clock)
    event = await loop.tick()
    assert event is not None and not event.stale
    assert event.model == "portfolio"
    assert len(event.points) == 10
    # The sample stamped START measures the step before it: the first step forecast is the
    # one from START (predictor/core/forecasting.py keeps samples at their step's start).
    assert event.points[0].at.timestamp() == START
    assert event.workload.name == "web" and event.workload.kind == "Deployment.apps"
    assert source.queries[0] == 'sum(rate(http_requests_total{app="web"}[1m]))'
    expected = 100 + 50 * math.sin(2 * math.pi * (START + 60) / 86400)
    assert event.points[0].q50 == pytest.approx(expected, rel=0.05)

    clock.value += 60
    second = await loop.tick()
    assert second is not None and second.points[0].at.timestamp() == START + 60
    assert loop.state.model is not None and loop.state.last_fit_at == START  # updated, not refitted


@pytest.mark.parametrize("mode", ["down", "slow", "nan", "empty"])
async def test_outage_publishes_stale_widened_forecasts_logs_once_and_recovers(
    mode: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="tideshift.predictor")
    source, clock = ScriptedSource(), SteppedClock(START)
    loop = forecaster(source, clock)
    fresh = await loop.tick()
    assert fresh is not None
    source.mode = mode
    stale_events = []
    for minute in range(1, 8):
        clock.value = START + 60 * minute
        event = await loop.tick()
        assert event is not None
        stale_events.append(event)
    stale = [event for event in stale_events if event.stale]
    # "nan"/"empty" only count as an outage after stale_after_seconds without data.
    assert len(stale) >= (4 if mode in {"nan", "empty"} else 7)
    last = stale[-1]
    assert last.points[0].at.timestamp() == clock.value  # the step in force now, none past
    assert last.stale_reason
    for point in last.points:
        assert point.q50 <= point.q90 <= point.q95 <= point.q99
    same_time = {p.at: p for p in fresh.points}
    overlap = [p for p in last.points if p.at in same_time]
    assert overlap and all(p.q95 > same_time[p.at].q95 * 1.2 for p in overlap)
    warnings = [r for r in caplog.records if "metric source failing" in r.getMessage()]
    assert len(warnings) == 1

    source.mode = "ok"
    clock.value += 60
    recovered = await loop.tick()
    assert recovered is not None and not recovered.stale
    assert any("metrics are back" in r.getMessage() for r in caplog.records)


async def test_no_history_and_no_source_publishes_nothing() -> None:
    source, clock = ScriptedSource(), SteppedClock(START)
    source.mode = "down"
    loop = forecaster(source, clock)
    assert await loop.tick() is None
    assert await loop.tick() is None


async def test_refit_happens_on_the_cadence() -> None:
    source, clock = ScriptedSource(), SteppedClock(START)
    loop = forecaster(source, clock, refit_seconds=300.0)
    await loop.tick()
    first_model = loop.state.model
    clock.value += 240
    await loop.tick()
    assert loop.state.model is first_model
    clock.value += 60
    await loop.tick()
    assert loop.state.model is not first_model and loop.state.last_fit_at == clock.value


async def test_history_is_bounded() -> None:
    source, clock = ScriptedSource(), SteppedClock(START)
    loop = forecaster(source, clock, history_seconds=3600.0)
    for _ in range(5):
        await loop.tick()
        clock.value += 600
    assert loop.state.timestamps[-1] - loop.state.timestamps[0] < 3600.0


async def test_sim_source_answers_on_the_step_grid() -> None:
    source = SimMetricSource(lambda t: t / 60)
    samples = await source.range("q", start=59.0, end=240.0, step_s=60.0)
    np.testing.assert_array_equal(samples.timestamps, [60, 120, 180, 240])
    np.testing.assert_array_equal(samples.values, [1, 2, 3, 4])


async def test_observed_demand_is_the_latest_value_and_unusable_values_are_skipped() -> None:
    source, clock = ScriptedSource(), SteppedClock(START + 7.5)
    loop = forecaster(source, clock)
    event = await loop.observe()
    assert event is not None
    assert event.rps == 120.0
    assert event.observed_at.timestamp() == START + 7.5
    assert (event.workload.namespace, event.workload.name) == ("shop", "web")
    for mode in ("nan", "empty", "negative", "down", "slow"):
        source.mode = mode
        assert await loop.observe() is None, mode


def test_parse_vector_sums_series_and_says_when_nothing_answered() -> None:
    result = [
        {"metric": {"pod": "a"}, "value": [1.0, "2.5"]},
        {"metric": {"pod": "b"}, "value": [1.0, "4"]},
        {"metric": {"pod": "c"}, "value": "garbage"},
    ]
    assert parse_vector(result) == 6.5
    assert parse_vector([]) is None
    with pytest.raises(MetricSourceError, match="vector"):
        parse_vector({"error": "bad"})


def test_parse_matrix_sums_series_and_keeps_nan() -> None:
    result = [
        {"metric": {"pod": "a"}, "values": [[60, "1"], [120, "NaN"]]},
        {"metric": {"pod": "b"}, "values": [[60, "2"], [120, "3"], [180, "bad"]]},
    ]
    samples = parse_matrix(result)
    np.testing.assert_array_equal(samples.timestamps, [60, 120])
    assert samples.values[0] == 3 and math.isnan(samples.values[1])
    assert len(parse_matrix([])) == 0
    with pytest.raises(MetricSourceError):
        parse_matrix({"unexpected": "shape"})


def test_settings_reject_unknown_models_and_bad_workloads() -> None:
    with pytest.raises(ValueError, match="unknown model"):
        settings(model="prophet")
    with pytest.raises(ValueError):
        settings(workloads=[{"namespace": "", "name": "web"}])
    query = WorkloadQuery(namespace="a", name="b", query='x{ns="$namespace"}')
    loop = WorkloadForecaster(
        spec=query, settings=settings(), source=ScriptedSource(), clock=SteppedClock(START)
    )
    assert loop.query == 'x{ns="a"}'


def test_main_reports_a_bad_flag(capsys) -> None:
    from tideshift.services.predictor.service import main

    with pytest.raises(SystemExit) as caught:
        main(["--workloads", "not json"])
    assert caught.value.code == 2
    assert "--workloads" in capsys.readouterr().err


class JumpingSource(ScriptedSource):
    """The diurnal rate, four times as high from `jump_at` on: no forecast saw it coming."""

    def __init__(self, jump_at: float) -> None:
        super().__init__()
        self.jump_at = jump_at

    async def range(self, query: str, *, start: float, end: float, step_s: float) -> Samples:
        samples = await super().range(query, start=start, end=end, step_s=step_s)
        return Samples(
            samples.timestamps,
            np.where(samples.timestamps > self.jump_at, 4 * samples.values, samples.values),
        )


async def test_forecasts_that_stop_covering_demand_are_published_untrusted_until_they_do(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="tideshift.predictor")
    jump_at = START + 30 * 60
    source, clock = JumpingSource(jump_at), SteppedClock(START)
    loop = forecaster(source, clock, coverage_window_steps=20, coverage_min_steps=10)
    events = []
    for minute in range(0, 240):
        clock.value = START + 60 * minute
        event = await loop.tick()
        assert event is not None
        events.append(event)
        if not event.untrusted_reason and any(e.untrusted_reason for e in events):
            break  # untrusted, then trusted again
    before = [e for e in events if e.issued_at.timestamp() <= jump_at]
    assert before[-1].coverage is not None and before[-1].coverage >= 0.85
    assert not any(e.untrusted_reason for e in before)
    untrusted = [e for e in events if e.untrusted_reason]
    assert untrusted, "the jump never made the forecast untrusted"
    assert untrusted[0].coverage is not None and untrusted[0].coverage < 0.75
    assert "q0.95 held for" in untrusted[0].untrusted_reason
    # Once the model has the new level its forecasts cover again: trusted, announced once.
    assert not events[-1].untrusted_reason, "still untrusted four hours after one jump"
    messages = [r.getMessage() for r in caplog.records]
    assert sum("forecasts no longer trusted" in m for m in messages) == 1
    assert sum("forecasts trusted again" in m for m in messages) == 1
