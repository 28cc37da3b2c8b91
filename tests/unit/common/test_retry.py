"""Retry policies: the waits they name, and a retry loop that waits in the service's clock
time and stops when told to."""

from __future__ import annotations

import asyncio
import logging

import pytest

from tests.unit.common.fake_clock import RecordingClock
from tideshift.services.common.clock import wait_for_event
from tideshift.services.common.retry import (
    Backoff,
    Stopped,
    exponential,
    fixed,
    log_retries,
    retrying_async,
)


def test_exponential_doubles_up_to_its_cap() -> None:
    policy = exponential(initial=0.5, maximum=3.0)
    assert [policy.delay(n) for n in range(1, 6)] == [0.5, 1.0, 2.0, 3.0, 3.0]


def test_fixed_waits_the_same_after_every_failure() -> None:
    assert {fixed(2.0).delay(n) for n in range(1, 10)} == {2.0}


def test_jitter_shortens_each_wait_by_at_most_its_fraction() -> None:
    policy = Backoff(initial=1.0, maximum=8.0, jitter=0.2)
    for failures, full in [(1, 1.0), (2, 2.0), (4, 8.0), (9, 8.0)]:
        waits = {policy.delay(failures) for _ in range(200)}
        assert all(0.8 * full <= wait <= full for wait in waits)
        assert len(waits) > 1


async def test_retrying_async_retries_until_the_attempt_succeeds() -> None:
    calls = 0
    clock = RecordingClock()

    async def attempt() -> str:
        nonlocal calls
        calls += 1
        if calls < 4:
            raise ConnectionError("not yet")
        return "done"

    retrying = retrying_async(
        exponential(initial=0.5, maximum=1.0),
        clock=clock,
        stopping=asyncio.Event(),
        retry_on=ConnectionError,
    )
    assert await retrying(attempt) == "done"
    assert calls == 4
    assert clock.sleeps == [0.5, 1.0, 1.0]


async def test_retrying_async_raises_other_errors_at_once() -> None:
    async def attempt() -> None:
        raise KeyError("definite")

    retrying = retrying_async(
        fixed(1.0), clock=RecordingClock(), stopping=asyncio.Event(), retry_on=ConnectionError
    )
    with pytest.raises(KeyError):
        await retrying(attempt)


async def test_retrying_async_gives_up_when_stopping_is_set() -> None:
    stopping = asyncio.Event()
    calls = 0

    async def attempt() -> None:
        nonlocal calls
        calls += 1
        stopping.set()
        raise ConnectionError("down")

    retrying = retrying_async(
        exponential(initial=60, maximum=60),
        clock=RecordingClock(),
        stopping=stopping,
        retry_on=ConnectionError,
    )
    with pytest.raises(Stopped):
        await asyncio.wait_for(retrying(attempt), 10)
    assert calls == 1


async def test_retrying_async_reraises_the_last_error_once_told_to_give_up() -> None:
    calls = 0

    async def attempt() -> None:
        nonlocal calls
        calls += 1
        raise ConnectionError(f"down {calls}")

    retrying = retrying_async(
        fixed(1.0),
        clock=RecordingClock(),
        stopping=asyncio.Event(),
        retry_on=ConnectionError,
        give_up=lambda: calls >= 3,
    )
    with pytest.raises(ConnectionError, match="down 3"):
        await retrying(attempt)


async def test_wait_for_event_returns_whether_the_event_came() -> None:
    clock = RecordingClock()
    event = asyncio.Event()
    assert not await wait_for_event(clock, event, 5.0)
    assert clock.sleeps == [5.0]
    event.set()
    assert await wait_for_event(clock, event, 5.0)
    assert clock.sleeps == [5.0]  # already set: no wait at all


async def test_log_retries_names_the_error_and_the_wait(caplog: pytest.LogCaptureFixture) -> None:
    calls = 0

    async def attempt() -> None:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise ConnectionError("refused")

    retrying = retrying_async(
        fixed(1.5),
        clock=RecordingClock(),
        stopping=asyncio.Event(),
        retry_on=ConnectionError,
        before_sleep=log_retries(logging.getLogger("test.retry"), "connecting"),
    )
    with caplog.at_level(logging.WARNING, logger="test.retry"):
        await retrying(attempt)
    assert [record.message for record in caplog.records] == [
        "connecting failed (refused); again in 1.5s"
    ]
