"""`poll_until`: how trainer services wait for what another process publishes (the spec, the
layout, a lease): the first answer, asked at the named interval of the clock, or None once
stopping; on a recording clock."""

from __future__ import annotations

import asyncio
import logging

import pytest

from tests.unit.common.fake_clock import RecordingClock
from tideshift.services.trainer.port.jobs import poll_until


async def test_the_first_answer_comes_back_after_waits_of_the_interval(
    caplog: pytest.LogCaptureFixture,
) -> None:
    answers = iter([None, None, "spec"])
    clock = RecordingClock()

    async def read() -> str | None:
        return next(answers)

    with caplog.at_level(logging.INFO, logger="tideshift.trainer"):
        found = await poll_until(
            read, clock=clock, stopping=asyncio.Event(), every=0.5, waiting="waiting for x"
        )
    assert found == "spec"
    assert clock.sleeps == [0.5, 0.5]
    assert [record.message for record in caplog.records] == ["waiting for x"]  # once


async def test_an_answer_at_once_means_no_wait_and_no_log(caplog: pytest.LogCaptureFixture) -> None:
    clock = RecordingClock()

    async def read() -> int | None:
        return 0  # falsy, yet an answer

    with caplog.at_level(logging.INFO, logger="tideshift.trainer"):
        assert (
            await poll_until(read, clock=clock, stopping=asyncio.Event(), every=1.0, waiting="x")
            == 0
        )
    assert clock.sleeps == []
    assert not caplog.records


async def test_stopping_ends_the_wait_with_none() -> None:
    stopping = asyncio.Event()
    reads = 0

    async def read() -> str | None:
        nonlocal reads
        reads += 1
        stopping.set()
        return None

    clock = RecordingClock()
    assert await poll_until(read, clock=clock, stopping=stopping, every=60.0, waiting="x") is None
    assert reads == 1
    assert clock.sleeps == []
