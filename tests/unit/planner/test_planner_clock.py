"""The planner keeps one time base: its clock's. Under a simulated clock running far faster
than the wall clock, its tick interval and its "cluster view stale" guard are simulated time."""

from __future__ import annotations

import asyncio
import itertools
from datetime import UTC, datetime

from tideshift.events import NodeChanged, Resources
from tideshift.services.common.clock import wait_for_event
from tideshift.services.demo.clock import SimClock
from tideshift.services.planner.core.state import PlannerState
from tideshift.services.planner.service import Planner
from tideshift.services.planner.settings import PlannerSettings

START = datetime(2026, 1, 5, tzinfo=UTC).timestamp()
FAST = 20_000.0  # simulated seconds per wall second


def node_event(clock: SimClock) -> NodeChanged:
    return NodeChanged(
        change="added",
        name="n1",
        allocatable=Resources(cpu=16.0),
        observed_at=datetime.fromtimestamp(clock.now(), tz=UTC),
    )


async def test_cluster_view_goes_stale_after_simulated_silence() -> None:
    clock = SimClock(FAST, start=START)
    settings = PlannerSettings(health_port=-1, cluster_silence_seconds=600.0)
    state = PlannerState(settings.state_config(), started_at=clock.now())
    state.apply_node(node_event(clock), clock.now())
    assert not state.inputs(clock.now()).cluster_stale

    await clock.sleep(settings.cluster_silence_seconds + 60.0)

    assert state.inputs(clock.now()).cluster_stale
    state.apply_node(node_event(clock), clock.now())  # the watcher speaks again: fresh at once
    assert not state.inputs(clock.now()).cluster_stale


async def test_clock_sleep_waits_simulated_time_and_events_cut_it_short() -> None:
    clock = SimClock(FAST, start=START)
    before = clock.now()
    event = asyncio.Event()
    assert not await wait_for_event(clock, event, 3600.0)
    assert clock.now() - before >= 3600.0
    event.set()
    assert await wait_for_event(clock, event, 1e9)


async def test_a_frozen_clock_holds_sleepers_until_it_runs() -> None:
    clock = SimClock(FAST, start=START, frozen=True)
    sleeper = asyncio.ensure_future(clock.sleep(60.0))
    for _ in range(20):
        await asyncio.sleep(0)
    assert not sleeper.done()
    clock.run()
    await asyncio.wait_for(sleeper, 10.0)
    assert clock.now() >= START + 60.0


class RecordingPlanner(Planner):
    """Records the clock time of each plan instead of planning (no bus needed)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        self.planned_at: list[tuple[str, float]] = []

    async def plan_once(self, trigger: str) -> None:
        self.planned_at.append((trigger, self.clock.now()))
        if len(self.planned_at) >= 4:
            self.stopping.set()


async def test_plan_loop_ticks_every_interval_of_clock_time() -> None:
    clock = SimClock(FAST, start=START)
    tick_seconds = 900.0
    settings = PlannerSettings(health_port=-1, tick_seconds=tick_seconds)
    planner = RecordingPlanner(
        bus=None,  # type: ignore[arg-type]  # plan_once is replaced: nothing is published
        settings=settings,
        instance="t",
        stopping=asyncio.Event(),
        clock=clock,
    )
    # 4 ticks of 15 simulated minutes: well under a second of wall time at this speed; a loop
    # that waited wall seconds would not finish in time.
    await asyncio.wait_for(planner._plan_loop(), 30.0)
    times = [at for trigger, at in planner.planned_at if trigger == "tick"]
    assert len(times) == 4
    gaps = [later - earlier for earlier, later in itertools.pairwise(times)]
    assert all(gap >= tick_seconds for gap in gaps)
