"""Retry policies, declared by name where they are used, and run by tenacity.

A `Backoff` is a policy: how long to wait after the n-th failure. It is a tenacity wait
strategy, and also answers `delay(n)` directly where no loop runs here (the executor hands a
failed command back to JetStream with that delay; an informer thread counts its failures).
`retrying_async` runs an attempt until it succeeds, waiting per the policy, and gives up
quietly (raises `Stopped`) the moment the stop signal is set. Imports no service.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from dataclasses import dataclass

from tenacity import AsyncRetrying, RetryCallState, retry_if_exception_type

RetryOn = type[BaseException] | tuple[type[BaseException], ...]
BeforeSleep = Callable[[RetryCallState], None]


class Stopped(Exception):
    """The stop signal came while waiting to retry: the caller is shutting down."""


@dataclass(frozen=True)
class Backoff:
    """Wait `initial` seconds after the first failure, `factor` times longer after each next
    one, never longer than `maximum`."""

    initial: float
    maximum: float
    factor: float = 2.0

    def delay(self, failures: int) -> float:
        """Seconds to wait after `failures` failures in a row (1 = the first)."""
        return min(self.initial * self.factor ** max(0, failures - 1), self.maximum)

    def __call__(self, state: RetryCallState) -> float:
        # tenacity's wait strategy: the attempt that just failed is the n-th failure.
        return self.delay(state.attempt_number)


def exponential(*, initial: float, maximum: float) -> Backoff:
    """Doubling waits: `initial`, 2 x `initial`, ... up to `maximum`."""
    return Backoff(initial=initial, maximum=maximum)


def fixed(seconds: float) -> Backoff:
    """The same wait after every failure."""
    return Backoff(initial=seconds, maximum=seconds, factor=1.0)


def retrying_async(
    policy: Backoff,
    *,
    stopping: asyncio.Event,
    retry_on: RetryOn,
    before_sleep: BeforeSleep | None = None,
) -> AsyncRetrying:
    """`await retrying_async(...)(attempt)`: retries `retry_on` errors until `stopping`."""

    async def sleep(seconds: float) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stopping.wait(), seconds)
        if stopping.is_set():
            raise Stopped

    return AsyncRetrying(
        wait=policy,
        sleep=sleep,
        retry=retry_if_exception_type(retry_on),
        before_sleep=before_sleep,
        reraise=True,
    )
