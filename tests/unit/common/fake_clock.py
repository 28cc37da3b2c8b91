"""A `Clock` for tests: every sleep is recorded and moves time on at once (no real waiting)."""

from __future__ import annotations

import asyncio


class RecordingClock:
    """Implements the `Clock` port; `sleeps` lists every wait asked of it, in order."""

    def __init__(self, start: float = 1_000_000.0) -> None:
        self.time = start
        self.sleeps: list[float] = []

    def now(self) -> float:
        return self.time

    async def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.time += max(0.0, seconds)
        await asyncio.sleep(0)  # let the other tasks run, as a real wait would
