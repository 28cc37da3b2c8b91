"""What the executor's bus tests here share: coroutines run as tasks for the length of a
block, and a subscription's events gathered into a list."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any


@contextlib.asynccontextmanager
async def running(*coroutines: Any) -> AsyncIterator[None]:
    """Run `coroutines` as tasks until the block ends; then cancel them and wait for them."""
    tasks = [asyncio.ensure_future(coroutine) for coroutine in coroutines]
    try:
        yield
    finally:
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task


async def collect(iterator: AsyncIterator[Any], into: list[Any]) -> None:
    """Append each event's data from `iterator` to `into`."""
    async for item in iterator:
        into.append(item.data)
