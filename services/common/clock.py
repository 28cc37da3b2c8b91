"""The clock port: what time it is and how long to wait, in one time base.

Services read the time and wait through a `Clock`, never `time.time()` and a bare
`asyncio.sleep` side by side: a simulated clock (the demo's, `speed` times the wall clock)
then gives intervals, event stamps and staleness in the same seconds. `WallClock` is the
real time every `tideshift run <service>` uses.
"""

from __future__ import annotations

import asyncio
import heapq
import time
from datetime import UTC, datetime
from typing import Protocol


class Clock(Protocol):
    def now(self) -> float:
        """Unix seconds."""
        ...

    async def sleep(self, seconds: float) -> None:
        """Return after `seconds` of this clock's time have passed."""
        ...


class WallClock:
    """Real time."""

    def now(self) -> float:
        return time.time()

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(max(0.0, seconds))


WALL_CLOCK = WallClock()


async def wait_for_event(
    clock: Clock, event: asyncio.Event, seconds: float, *sooner: asyncio.Event
) -> bool:
    """Wait until `event` is set or `seconds` of `clock` time pass; whether it was set.
    Any of `sooner` being set also ends the wait early (without counting as `event`).

    The one "wait unless stopping" of the services (a tick, a poll, a retry's backoff):

        while not stopping.is_set():
            do_one_round()
            if await wait_for_event(clock, stopping, interval_s):
                break
    """
    if event.is_set() or any(early.is_set() for early in sooner):
        return event.is_set()
    waiters: list[asyncio.Future[object]] = [
        asyncio.ensure_future(each.wait()) for each in (event, *sooner)
    ]
    waiters.append(asyncio.ensure_future(clock.sleep(seconds)))
    try:
        await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for waiter in waiters:
            waiter.cancel()
    return event.is_set()


def utc_now(clock: Clock) -> datetime:
    """`clock`'s time as an aware datetime (for event timestamps)."""
    return datetime.fromtimestamp(clock.now(), UTC)


class ManualClock:
    """Virtual time for tests: `sleep` returns only once `advance` has moved the time past its
    end, so a service's intervals, timeouts and expiries pass without waiting for them."""

    def __init__(self, start: float = 1_000_000.0) -> None:
        self._now = start
        self._sleepers: list[tuple[float, int, asyncio.Future[None]]] = []
        self._order = 0

    def now(self) -> float:
        return self._now

    async def sleep(self, seconds: float) -> None:
        if seconds <= 0:
            await asyncio.sleep(0)
            return
        wake: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._order += 1
        heapq.heappush(self._sleepers, (self._now + seconds, self._order, wake))
        await wake

    async def advance(self, seconds: float) -> None:
        """Move the time on by `seconds`, waking each sleeper due on the way in order and
        letting the tasks it wakes run (and sleep again) before the time moves further."""
        end = self._now + seconds
        await _settle()
        while self._sleepers and self._sleepers[0][0] <= end:
            due, _, wake = heapq.heappop(self._sleepers)
            if wake.done():  # cancelled: its waiter left
                continue
            self._now = max(self._now, due)
            wake.set_result(None)
            await _settle()
        self._now = max(self._now, end)
        await _settle()


async def _settle(rounds: int = 20) -> None:
    """Let every task that is ready run, and what they wake in turn."""
    for _ in range(rounds):
        await asyncio.sleep(0)
