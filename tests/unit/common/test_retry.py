"""Retry policies: the waits they name, and a retry loop that stops when told to."""

from __future__ import annotations

import asyncio

import pytest

from tideshift.services.common.retry import Stopped, exponential, fixed, retrying_async


def test_exponential_doubles_up_to_its_cap() -> None:
    policy = exponential(initial=0.5, maximum=3.0)
    assert [policy.delay(n) for n in range(1, 6)] == [0.5, 1.0, 2.0, 3.0, 3.0]


def test_fixed_waits_the_same_after_every_failure() -> None:
    assert {fixed(2.0).delay(n) for n in range(1, 10)} == {2.0}


async def test_retrying_async_retries_until_the_attempt_succeeds() -> None:
    calls = 0

    async def attempt() -> str:
        nonlocal calls
        calls += 1
        if calls < 3:
            raise ConnectionError("not yet")
        return "done"

    retrying = retrying_async(fixed(0.001), stopping=asyncio.Event(), retry_on=ConnectionError)
    assert await retrying(attempt) == "done"
    assert calls == 3


async def test_retrying_async_raises_other_errors_at_once() -> None:
    async def attempt() -> None:
        raise KeyError("definite")

    retrying = retrying_async(fixed(0.001), stopping=asyncio.Event(), retry_on=ConnectionError)
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
        exponential(initial=60, maximum=60), stopping=stopping, retry_on=ConnectionError
    )
    with pytest.raises(Stopped):
        await asyncio.wait_for(retrying(attempt), 10)
    assert calls == 1
