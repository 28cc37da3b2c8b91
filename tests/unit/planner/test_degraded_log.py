"""The planner logs degraded reasons that are new, a few at a time: thousands of workloads
announced one by one must not log the whole list again at every plan."""

from __future__ import annotations

import logging

import pytest

from tideshift.services.planner.metrics import LOGGED_REASONS, log_degraded


def test_only_new_reasons_are_logged_and_a_flood_in_one_line(
    caplog: pytest.LogCaptureFixture,
) -> None:
    before = [f"w-{i}: no forecast; holding" for i in range(3)]
    after = [*before, *(f"w-{i}: no forecast; holding" for i in range(3, 503))]
    with caplog.at_level(logging.WARNING, logger="tideshift.planner"):
        log_degraded(before, after)
    lines = [record.getMessage() for record in caplog.records]
    assert len(lines) == LOGGED_REASONS + 1
    assert lines[0] == "degraded: w-3: no forecast; holding"
    assert not any("w-0:" in line for line in lines)
    assert lines[-1] == f"degraded: {500 - LOGGED_REASONS} more (503 in all)"
