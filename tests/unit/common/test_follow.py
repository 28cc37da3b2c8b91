"""`follow`: every item reaches the handler, failures are followed again after exponential
waits in the service's clock time, and the stop signal ends it; all on a recording clock."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable

from tests.unit.common.fake_clock import RecordingClock
from tideshift.services.common.bus import follow
from tideshift.services.common.retry import exponential

BACKOFF = exponential(initial=0.5, maximum=2.0)
SAFETY_S = 10.0  # a test that would hang fails instead


def scripted(*rounds: list[object], stopping: asyncio.Event) -> Callable[[], AsyncIterator[int]]:
    """One subscription per round: yields its ints, raises its exception; after the last
    round the stop signal is set."""
    remaining = list(rounds)

    async def stream() -> AsyncIterator[int]:
        if not remaining:
            stopping.set()
            await stopping.wait()
            return
        for step in remaining.pop(0):
            if isinstance(step, Exception):
                raise step
            assert isinstance(step, int)
            yield step

    return stream


async def run(
    open_stream: Callable[[], AsyncIterator[int]],
    stopping: asyncio.Event,
    handle: Callable[[int], object] | None = None,
) -> tuple[list[int], RecordingClock]:
    seen: list[int] = []
    clock = RecordingClock()
    await asyncio.wait_for(
        follow(
            open_stream,
            handle or seen.append,
            clock=clock,
            stopping=stopping,
            name="test stream",
            backoff=BACKOFF,
        ),
        SAFETY_S,
    )
    return seen, clock


async def test_every_item_reaches_the_handler_until_stopping() -> None:
    stopping = asyncio.Event()
    seen, clock = await run(scripted([1, 2, 3], stopping=stopping), stopping)
    assert seen == [1, 2, 3]
    # The stream ended while the service ran, having delivered: followed again at once.
    assert clock.sleeps == []


async def test_failures_in_a_row_wait_exponentially_up_to_the_cap() -> None:
    stopping = asyncio.Event()
    down = ConnectionError("no server")
    seen, clock = await run(
        scripted([down], [down], [down], [down], [7], stopping=stopping), stopping
    )
    assert seen == [7]
    assert clock.sleeps == [0.5, 1.0, 2.0, 2.0]


async def test_a_stream_that_delivered_starts_a_new_streak_at_once() -> None:
    stopping = asyncio.Event()
    down = ConnectionError("lost")
    seen, clock = await run(
        scripted([down], [down], [1, down], [down], [2], stopping=stopping), stopping
    )
    assert seen == [1, 2]
    # 0.5, 1.0 for the first two; none after the one that delivered; 0.5 (a new streak)
    # after the next.
    assert clock.sleeps == [0.5, 1.0, 0.5]


async def test_a_handler_error_skips_that_item_only() -> None:
    stopping = asyncio.Event()
    seen: list[int] = []

    def handle(item: int) -> None:
        if item == 2:
            raise ValueError("bad item")
        seen.append(item)

    await run(scripted([1, 2, 3], stopping=stopping), stopping, handle)
    assert seen == [1, 3]


async def test_async_handlers_are_awaited_and_the_item_in_hand_is_finished() -> None:
    stopping = asyncio.Event()
    finished: list[int] = []

    async def handle(item: int) -> None:
        stopping.set()  # the stop signal comes while this item is in hand
        await asyncio.sleep(0)
        finished.append(item)

    await run(scripted([1, 2], stopping=stopping), stopping, handle)
    assert finished == [1]


async def test_stopping_during_a_wait_ends_it_without_another_attempt() -> None:
    stopping = asyncio.Event()
    opened = 0

    async def stream() -> AsyncIterator[int]:
        nonlocal opened
        opened += 1
        stopping.set()
        raise ConnectionError("down")
        yield 0  # an async generator

    await run(stream, stopping)
    assert opened == 1


async def test_a_stream_that_ends_without_items_counts_as_a_failure() -> None:
    stopping = asyncio.Event()
    seen, clock = await run(scripted([], [], [5], stopping=stopping), stopping)
    assert seen == [5]
    assert clock.sleeps == [0.5, 1.0]


def quiet_stream(opened: asyncio.Event, closed: asyncio.Event) -> Callable[[], AsyncIterator[int]]:
    """A subscription that never delivers; says when it is opened and when closed."""

    async def quiet() -> AsyncIterator[int]:
        opened.set()
        try:
            await asyncio.Event().wait()
            yield 0
        finally:
            closed.set()

    return quiet


async def test_stopping_ends_a_quiet_stream() -> None:
    stopping = asyncio.Event()
    opened, closed = asyncio.Event(), asyncio.Event()
    quiet = quiet_stream(opened, closed)
    following = asyncio.ensure_future(run(quiet, stopping))
    await asyncio.wait_for(opened.wait(), SAFETY_S)
    stopping.set()
    seen, _ = await following
    assert seen == []
    assert closed.is_set()


async def test_cancelling_the_caller_closes_the_subscription_at_once() -> None:
    stopping = asyncio.Event()
    opened, closed = asyncio.Event(), asyncio.Event()
    quiet = quiet_stream(opened, closed)
    following = asyncio.ensure_future(run(quiet, stopping))
    await asyncio.wait_for(opened.wait(), SAFETY_S)
    following.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await following
    assert following.cancelled()
    assert closed.is_set()
    assert not stopping.is_set()
