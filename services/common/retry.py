"""Retry policies, declared by name where they are used, and run by tenacity on a `Clock`.

A `Backoff` is a policy: how long to wait after the n-th failure in a row. It is a tenacity
wait strategy, and also answers `delay(n)` directly where no loop runs here (the executor
hands a failed command back to JetStream with that delay; an informer thread counts its
failures). `retrying_async` runs an attempt until it succeeds, waiting per the policy in the
service's `Clock` time, and gives up quietly (raises `Stopped`) the moment the stop signal is
set. Every retry and resubscribe loop in the services is one of these (the bus's `follow`
is built on it). Imports no service.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Callable
from dataclasses import dataclass

from tenacity import AsyncRetrying, RetryCallState, retry_if_exception_type, stop_never

from tideshift.services.common.clock import Clock, wait_for_event

RetryOn = type[BaseException] | tuple[type[BaseException], ...]
BeforeSleep = Callable[[RetryCallState], None]


class Stopped(Exception):
    """The stop signal came while waiting to retry: the caller is shutting down."""


@dataclass(frozen=True)
class Backoff:
    """Wait `initial` seconds after the first failure, `factor` times longer after each next
    one, never longer than `maximum`. With `jitter` (a fraction, 0 to 1) each wait is drawn
    from [(1 - jitter) x wait, wait], so that followers that failed together (a NATS restart)
    do not all come back in the same instant."""

    initial: float
    maximum: float
    factor: float = 2.0
    jitter: float = 0.0

    def delay(self, failures: int) -> float:
        """Seconds to wait after `failures` failures in a row (1 = the first)."""
        wait = min(self.initial * self.factor ** max(0, failures - 1), self.maximum)
        if self.jitter:
            wait *= 1.0 - self.jitter * random.random()  # spreading, not secrets
        return wait

    def __call__(self, state: RetryCallState) -> float:
        # tenacity's wait strategy: the attempt that just failed is the n-th failure.
        return self.delay(state.attempt_number)


def exponential(*, initial: float, maximum: float, jitter: float = 0.0) -> Backoff:
    """Doubling waits: `initial`, 2 x `initial`, ... up to `maximum`."""
    return Backoff(initial=initial, maximum=maximum, jitter=jitter)


def fixed(seconds: float) -> Backoff:
    """The same wait after every failure."""
    return Backoff(initial=seconds, maximum=seconds, factor=1.0)


def log_retries(logger: logging.Logger, what: str, *, level: int = logging.WARNING) -> BeforeSleep:
    """A `before_sleep` that logs "`what` failed (the error); again in N s" at `level`."""

    def before_sleep(state: RetryCallState) -> None:
        error = state.outcome.exception() if state.outcome is not None else None
        wait = state.next_action.sleep if state.next_action is not None else 0.0
        logger.log(level, "%s failed (%s); again in %.1fs", what, error, wait)

    return before_sleep


def retrying_async(
    policy: Backoff,
    *,
    clock: Clock,
    stopping: asyncio.Event,
    retry_on: RetryOn,
    before_sleep: BeforeSleep | None = None,
    give_up: Callable[[], bool] | None = None,
) -> AsyncRetrying:
    """A retry loop: `await retrying_async(...)(attempt, *args)` calls `attempt` until it
    returns, retrying `retry_on` errors after the policy's waits (in `clock` time).

    Raises `Stopped` once `stopping` is set during a wait; re-raises the last error when
    `give_up()` says so after a failure, and any other error at once. `attempt` must be an
    `async def` function: tenacity calls anything else synchronously, so a lambda's
    coroutine would come back unawaited. For example:

        retrying = retrying_async(
            exponential(initial=0.5, maximum=30), clock=clock, stopping=stopping,
            retry_on=ConnectionError, before_sleep=log_retries(log, "starting the watcher"),
        )
        try:
            watcher = await retrying(start_watcher)
        except Stopped:
            return
    """

    async def sleep(seconds: float) -> None:
        if await wait_for_event(clock, stopping, seconds):
            raise Stopped

    return AsyncRetrying(
        wait=policy,
        sleep=sleep,
        stop=stop_never if give_up is None else (lambda _state: give_up()),
        retry=retry_if_exception_type(retry_on),
        before_sleep=before_sleep,
        reraise=True,
    )
