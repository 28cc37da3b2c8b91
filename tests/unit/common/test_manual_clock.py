"""`ManualClock`: sleepers wake in order as virtual time is advanced past them, never before."""

from __future__ import annotations

import asyncio

from tideshift.services.common.clock import ManualClock, wait_for_event


async def test_sleepers_wake_in_time_order_and_only_once_the_time_has_come() -> None:
    clock = ManualClock(start=100.0)
    woke: list[tuple[str, float]] = []

    async def nap(name: str, seconds: float) -> None:
        await clock.sleep(seconds)
        woke.append((name, clock.now()))

    tasks = [asyncio.create_task(nap("late", 30.0)), asyncio.create_task(nap("soon", 10.0))]
    await clock.advance(9.0)
    assert (woke, clock.now()) == ([], 109.0)
    await clock.advance(25.0)
    assert woke == [("soon", 110.0), ("late", 130.0)]
    assert clock.now() == 134.0
    await asyncio.gather(*tasks)


async def test_a_loop_that_sleeps_again_runs_once_per_interval_advanced() -> None:
    clock = ManualClock()
    stopping = asyncio.Event()
    rounds: list[float] = []

    async def loop() -> None:
        while not stopping.is_set():
            rounds.append(clock.now())
            if await wait_for_event(clock, stopping, 5.0):
                return

    task = asyncio.create_task(loop())
    await clock.advance(0)
    await clock.advance(12.0)
    start = rounds[0]
    assert [at - start for at in rounds] == [0.0, 5.0, 10.0]
    stopping.set()
    await task
