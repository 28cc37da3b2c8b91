"""A Prometheus query's history as a request-count trace (`timestamp_s,requests`, the format
loadgen/traces.py reads and the simulator replays).

The range is fetched in chunks of at most `MAX_POINTS` steps (Prometheus refuses a range
query of more than 11,000 points per series). Steps with no sample are gaps: each is reported
and filled by linear interpolation between its neighbours (the trace format needs a regular
grid), so the replay neither drops to zero nor invents a spike there.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from tideshift.loadgen.traces import HEADER

MAX_POINTS = 10_000  # per range query; Prometheus allows 11,000


class ExportError(ValueError):
    """A history that cannot become a trace; the message says what to do."""


class RangeSource(Protocol):
    """The one call of prometheus_api_client's `PrometheusConnect` used here."""

    def custom_query_range(
        self, query: str, start_time: datetime, end_time: datetime, step: str
    ) -> list[dict[str, Any]]: ...


@dataclass(frozen=True)
class Gap:
    start: float  # unix seconds of the first missing step
    steps: int


@dataclass(frozen=True)
class History:
    """Requests/s on a regular grid from `start` (unix seconds), every `step_s`; gaps filled."""

    start: float
    step_s: float
    rates: np.ndarray
    gaps: tuple[Gap, ...]

    @property
    def missing_steps(self) -> int:
        return sum(gap.steps for gap in self.gaps)


def fetch(
    source: RangeSource,
    query: str,
    *,
    start: float,
    end: float,
    step_s: float,
    progress: Callable[[str], None] = lambda _: None,
) -> History:
    """The query's values on the grid start, start + step, ... <= end (unix seconds)."""
    grid_start = math.ceil(start / step_s) * step_s  # Prometheus evaluates at start + k*step
    count = int((end - grid_start) // step_s) + 1
    if count < 2:
        raise ExportError(f"--since: the range holds {max(count, 0)} step(s); expected at least 2")
    values = np.full(count, np.nan)
    chunks = range(0, count, MAX_POINTS)
    for number, first in enumerate(chunks, start=1):
        last = min(first + MAX_POINTS, count) - 1
        series = source.custom_query_range(
            query,
            datetime.fromtimestamp(grid_start + first * step_s, UTC),
            datetime.fromtimestamp(grid_start + last * step_s, UTC),
            f"{step_s:g}s",
        )
        if len(series) > 1:
            raise ExportError(
                f"--query: returned {len(series)} series; expected one (wrap it in sum(...))"
            )
        for stamp, value in series[0]["values"] if series else ():
            index = round((float(stamp) - grid_start) / step_s)
            if 0 <= index < count and math.isfinite(rate := float(value)):
                values[index] = max(rate, 0.0)
        progress(f"fetched {number}/{len(chunks)} chunks ({last + 1}/{count} steps)")
    return fill_gaps(grid_start, step_s, values)


def fill_gaps(start: float, step_s: float, values: np.ndarray) -> History:
    """Interpolate the NaN steps; leading and trailing ones take the nearest value."""
    known = np.flatnonzero(~np.isnan(values))
    if known.size == 0:
        raise ExportError(
            "--query: no samples in the range; check the query in Prometheus's graph page "
            "and that --since does not reach past its retention"
        )
    missing = np.isnan(values)
    edges = np.diff(np.r_[0, missing.astype(np.int8), 0])
    gaps = tuple(
        Gap(start + begin * step_s, int(end - begin))
        for begin, end in zip(np.flatnonzero(edges == 1), np.flatnonzero(edges == -1), strict=True)
    )
    steps = np.arange(values.size)
    filled = np.interp(steps, known, values[known])
    return History(start, step_s, filled, gaps)


def write_trace(history: History, path: Path) -> None:
    """`timestamp_s` from 0, `requests` in each step (requests/s x step)."""
    lines = [",".join(HEADER)]
    lines += [
        f"{k * history.step_s:g},{rate * history.step_s:.6g}"
        for k, rate in enumerate(history.rates)
    ]
    path.write_text("\n".join(lines) + "\n")


def describe_gaps(history: History, *, limit: int = 5) -> list[str]:
    """One line per gap (the longest `limit`), then how many more."""
    longest: Sequence[Gap] = sorted(history.gaps, key=lambda gap: -gap.steps)[:limit]
    lines = [
        f"gap: {gap.steps} step(s) from "
        f"{datetime.fromtimestamp(gap.start, UTC):%Y-%m-%d %H:%M} UTC, interpolated"
        for gap in longest
    ]
    if len(history.gaps) > limit:
        lines.append(f"... and {len(history.gaps) - limit} shorter gap(s)")
    return lines
