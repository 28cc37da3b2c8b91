"""Following a stream for as long as a service runs: decides when to subscribe again and how
long to wait first. Imports no nats and no service (the stream is whatever `open_stream`
returns: `Bus.subscribe`, `Bus.consume`, a test's generator)."""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from tideshift.services.common.clock import Clock
from tideshift.services.common.retry import (
    Backoff,
    Stopped,
    exponential,
    log_retries,
    retrying_async,
)

log = logging.getLogger("tideshift.bus")
T = TypeVar("T")

# Half a second after the first failure, doubling to half a minute: a NATS restart is over
# in seconds, a long outage costs one attempt per half minute; 20 % jitter spreads the
# followers of a process that all lost the same connection.
RESUBSCRIBE = exponential(initial=0.5, maximum=30.0, jitter=0.2)

OpenStream = Callable[[], AsyncIterator[T]]
Handle = Callable[[T], Awaitable[None] | None]


class StreamEnded(Exception):
    """The stream ended although the service still runs (its subscription was closed)."""


async def follow(
    open_stream: OpenStream[T],
    handle: Handle[T],
    *,
    clock: Clock,
    stopping: asyncio.Event,
    name: str,
    backoff: Backoff = RESUBSCRIBE,
) -> None:
    """Hand every item of `open_stream()` to `handle` until `stopping` is set; then return.

    A stream that fails or ends is opened again after `backoff`'s wait for the n-th failure
    in a row (in `clock` time, cut short by `stopping`); one that delivered items before it
    failed is opened again at once and starts a new streak. An error in `handle` is logged
    and the item skipped: one bad item never ends the following. The item in hand is
    finished before `stopping` is looked at (a JetStream delivery is acked or handed back,
    never dropped). Cancelling the caller's task ends it at once. For example:

        await follow(
            lambda: bus.subscribe(NODE_CHANGED.filter(), consumer="planner-a"),
            lambda envelope: state.apply_node(envelope.data),
            clock=clock,
            stopping=context.stopping,
            name="node events",
        )
    """
    retrying = retrying_async(
        backoff,
        clock=clock,
        stopping=stopping,
        retry_on=Exception,
        before_sleep=log_retries(log, name),
    )
    with contextlib.suppress(Stopped):
        while not stopping.is_set():
            await retrying(_follow_once, open_stream, handle, stopping, name)


async def _follow_once(
    open_stream: OpenStream[T], handle: Handle[T], stopping: asyncio.Event, name: str
) -> None:
    """One subscription, until `stopping` (returns) or a failure: re-raised when nothing came
    (it counts towards the backoff), logged when items came (the next streak starts)."""
    stream = open_stream()
    progress = _Progress()
    pump = asyncio.ensure_future(_pump(stream, handle, stopping, name, progress))
    try:
        await _settle(pump, stopping, progress)
    finally:
        await _close(stream)
    failure = None if pump.cancelled() else pump.exception()
    if failure is None:
        if stopping.is_set():  # stopped, or closed for the shutdown: no failure
            return
        failure = StreamEnded(f"{name} ended")
    if not progress.delivered:
        raise failure
    log.warning("%s failed after %d items (%s); following again", name, progress.delivered, failure)


@dataclass
class _Progress:
    delivered: int = 0
    handling: bool = False


async def _pump(
    stream: AsyncIterator[T],
    handle: Handle[T],
    stopping: asyncio.Event,
    name: str,
    progress: _Progress,
) -> None:
    """Hand each item to `handle` until the stream ends or, after an item, `stopping` is set.
    One task for the whole subscription: a task per item cost ~15 us of the planner's loop
    per event, a plain `async for` ~0.4 us."""
    async for item in stream:
        progress.handling, progress.delivered = True, progress.delivered + 1
        await _handle_one(handle, item, name)
        progress.handling = False
        if stopping.is_set():
            return


async def _settle(pump: asyncio.Future[None], stopping: asyncio.Event, progress: _Progress) -> None:
    """Wait for `pump` to end or `stopping`; then let the item in hand finish (it returns
    after it) or cancel the wait for the next one. Cancelling the caller cancels `pump`."""
    stop_wait = asyncio.ensure_future(stopping.wait())
    either: set[asyncio.Future[Any]] = {pump, stop_wait}
    try:
        await asyncio.wait(either, return_when=asyncio.FIRST_COMPLETED)
        if not pump.done():
            if progress.handling:
                await asyncio.wait({pump})
            else:
                pump.cancel()
    except BaseException:
        pump.cancel()
        raise
    finally:
        stop_wait.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await pump


async def _close(stream: AsyncIterator[T]) -> None:
    """Close an async generator's subscription now rather than when it is collected."""
    close = getattr(stream, "aclose", None)
    if close is not None:
        with contextlib.suppress(Exception):
            await close()


async def _handle_one(handle: Handle[T], item: T, name: str) -> None:
    try:
        result = handle(item)
        if inspect.isawaitable(result):
            await result
    except Exception:
        log.exception("%s: skipped an item its handler failed on", name)
