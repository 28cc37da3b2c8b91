"""The executor's pure decision: replays, stale commands, bounds and the max-step guard."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from tideshift.services.cluster.port import ScaleState, WorkloadRef
from tideshift.services.executor.core.decision import (
    MAX_SKEW,
    AppliedRecord,
    clamp_issued_at,
    decide,
    screen,
)

T0 = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)
TARGET = WorkloadRef("ns", "Deployment", "web")


def state(replicas: int, low: int = 0, high: int | None = None) -> ScaleState:
    return ScaleState(TARGET, replicas=replicas, min_replicas=low, max_replicas=high)


def record(key: str, issued_at: datetime, *, applied: bool = True) -> AppliedRecord:
    return AppliedRecord(idempotency_key=key, issued_at=issued_at, desired=3, applied=applied)


@pytest.mark.parametrize(
    ("key", "issued_at", "last", "blocked"),
    [
        ("a", T0, None, None),
        ("a", T0, record("a", T0), "replay"),
        # Claimed but the process died before marking it applied: redo (idempotently).
        ("a", T0, record("a", T0, applied=False), None),
        ("b", T0 - timedelta(seconds=1), record("a", T0), "stale"),
        # Stale also against a newer command still being applied by another executor.
        ("b", T0 - timedelta(seconds=1), record("a", T0, applied=False), "stale"),
        ("b", T0 + timedelta(seconds=1), record("a", T0), None),
        ("b", T0, record("a", T0), None),  # same instant, different key: not older
    ],
)
def test_screen_drops_replays_and_stale_commands(
    key: str, issued_at: datetime, last: AppliedRecord | None, blocked: str | None
) -> None:
    reason = screen(idempotency_key=key, issued_at=issued_at, record=last)
    if blocked is None:
        assert reason is None
    else:
        assert reason is not None and reason.startswith(blocked)


@pytest.mark.parametrize(
    ("desired", "current", "low", "high", "max_step", "action", "replicas", "note"),
    [
        (5, 3, 0, None, 0, "apply", 5, ""),
        (3, 3, 0, None, 0, "noop", 3, "already at 3"),
        (0, 3, 1, None, 0, "apply", 1, "clamped to bounds [1, inf]"),
        (50, 3, 0, 10, 0, "apply", 10, "clamped to bounds [0, 10]"),
        (50, 10, 0, 10, 0, "noop", 10, "already at 10"),
        (20, 3, 0, None, 4, "apply", 7, "step limited to 4"),
        (0, 9, 0, None, 4, "apply", 5, "step limited to 4"),
        (6, 3, 0, None, 4, "apply", 6, ""),
        # Bounds first, then the step: 100 -> max 12 -> at most +4 from 3.
        (100, 3, 0, 12, 4, "apply", 7, "step limited to 4"),
    ],
)
def test_decide_clamps_and_limits_the_step(
    desired: int,
    current: int,
    low: int,
    high: int | None,
    max_step: int,
    action: str,
    replicas: int,
    note: str,
) -> None:
    decision = decide(desired, state(current, low, high), max_step=max_step)
    assert (decision.action, decision.replicas) == (action, replicas)
    assert note in decision.message
    if not note:
        assert decision.notes == ()


def test_negative_max_step_is_refused() -> None:
    with pytest.raises(ValueError, match="max_step"):
        decide(3, state(1), max_step=-1)


def test_a_far_future_stamp_is_clamped_to_the_skew() -> None:
    year_9999 = datetime(9999, 1, 1, tzinfo=UTC)
    assert clamp_issued_at(year_9999, T0) == T0 + MAX_SKEW
    assert clamp_issued_at(T0, T0) == T0
    # Recorded clamped, it holds later commands off for the skew only.
    last = record("future", clamp_issued_at(year_9999, T0))
    soon = T0 + timedelta(seconds=1)
    assert screen(idempotency_key="b", issued_at=soon, record=last) is not None
    later = T0 + MAX_SKEW + timedelta(seconds=1)
    assert screen(idempotency_key="c", issued_at=later, record=last) is None
