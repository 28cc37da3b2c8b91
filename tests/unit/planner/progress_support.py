"""For the planner's progress tests: a training coordinator's progress report, and how many
reports the planner ignored for a reason."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Literal

from prometheus_client import REGISTRY

from tideshift.events import JobProgress


def ignored(reason: str) -> float:
    """tideshift_planner_progress_ignored_total{reason} so far."""
    value = REGISTRY.get_sample_value(
        "tideshift_planner_progress_ignored_total", {"reason": reason}
    )
    return value or 0.0


def progress_report(
    job: str,
    at: float,
    done: int,
    *,
    epochs: int | None = 4,
    state: Literal["running", "finished"] = "running",
) -> JobProgress:
    """`done` shards applied of `epochs` epochs of 100 shards, at 10 trainers."""
    return JobProgress(
        job=job,
        state=state,
        epoch=done // 100,
        epochs=epochs,
        shards=100,
        applied_in_epoch=done % 100,
        applied_total=done,
        in_flight=0,
        redelivered=0,
        trainers=10,
        at=datetime.fromtimestamp(at, UTC),
    )
