"""Simulated time for the demo: a clock that runs `speed` times faster than the wall clock.

`now()` is in Unix seconds (so event timestamps look like real dates); `sleep(seconds)` waits
`seconds` of simulated time, so the services' intervals and staleness windows are in the same
time base as their timestamps. `start` is a midnight,
so hours since the start are hours of the simulated day; the clock may begin earlier
(`begin`), so the services run through the evening before the measured day.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from datetime import UTC, datetime

# Monday 5 January 2026, 00:00 UTC: a midnight at the start of a week.
DEFAULT_START = datetime(2026, 1, 5, tzinfo=UTC).timestamp()


class SimClock:
    """Implements the services' `Clock` port (`services/common/clock.py`)."""

    def __init__(
        self,
        speed: float,
        *,
        start: float = DEFAULT_START,
        monotonic: Callable[[], float] = time.monotonic,
        frozen: bool = False,
        begin: float | None = None,
    ) -> None:
        if speed <= 0:
            raise ValueError("speed must be > 0")
        if begin is not None and begin > start:
            raise ValueError("begin must be at or before start")
        self.speed = speed
        self.start = start
        self.begin = start if begin is None else begin
        self._monotonic = monotonic
        self._wall_start: float | None = None if frozen else monotonic()
        self._running = asyncio.Event()
        if not frozen:
            self._running.set()

    def run(self) -> None:
        """Start a frozen clock (services start up at `begin`, then time runs)."""
        if self._wall_start is None:
            self._wall_start = self._monotonic()
        self._running.set()

    async def sleep(self, seconds: float) -> None:
        """Wait `seconds` of simulated time (a frozen clock's sleepers wait for `run`)."""
        until = self.now() + seconds
        await self._running.wait()
        # asyncio may wake a timer up to its clock resolution early: sleep again for the rest.
        while (left := until - self.now()) > 0:  # noqa: ASYNC110
            await asyncio.sleep(left / self.speed)

    def now(self) -> float:
        if self._wall_start is None:
            return self.begin
        return self.begin + (self._monotonic() - self._wall_start) * self.speed

    def datetime(self) -> datetime:
        return datetime.fromtimestamp(self.now(), tz=UTC)
