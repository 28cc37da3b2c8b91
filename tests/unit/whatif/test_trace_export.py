"""Fetching a query's history in chunks, reporting and filling gaps, writing the trace the
simulator reads (services/whatif/export.py), with a fake of its one-call range port."""

from __future__ import annotations

from datetime import datetime
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tideshift.loadgen.traces import read_trace
from tideshift.services.whatif.export import (
    MAX_POINTS,
    ExportError,
    describe_gaps,
    fetch,
    write_trace,
)

STEP = 60.0
START = 1_700_000_040.0  # a multiple of STEP


class FakeRange:
    """Answers each range with `rate(t)` on Prometheus's grid, leaving out `missing` times."""

    def __init__(self, *, missing: range = range(0), series: int = 1) -> None:
        self.missing = missing
        self.series = series
        self.calls: list[tuple[float, float, str]] = []

    def custom_query_range(
        self, query: str, start_time: datetime, end_time: datetime, step: str
    ) -> list[dict[str, Any]]:
        start, end = start_time.timestamp(), end_time.timestamp()
        self.calls.append((start, end, step))
        stamps = np.arange(start, end + 1, STEP)
        values = [[t, str(rate(t))] for t in stamps if int((t - START) // STEP) not in self.missing]
        return [{"metric": {"n": str(i)}, "values": values} for i in range(self.series)]


def rate(t: float) -> float:
    return 10.0 + (t - START) / STEP


def test_a_long_range_is_fetched_in_contiguous_chunks_of_at_most_max_points() -> None:
    source = FakeRange()
    steps = 2 * MAX_POINTS + 5
    history = fetch(source, "q", start=START, end=START + (steps - 1) * STEP, step_s=STEP)
    assert len(source.calls) == 3
    assert all(call[2] == "60s" for call in source.calls)
    assert source.calls[0][0] == START
    for (_, end, _), (start, _, _) in zip(source.calls, source.calls[1:], strict=False):
        assert start == end + STEP  # no step fetched twice, none skipped
    assert history.rates.size == steps
    assert history.rates[0] == 10.0 and history.rates[-1] == 10.0 + steps - 1
    assert history.gaps == ()


def test_a_gap_is_reported_and_interpolated_and_edges_take_the_nearest_value() -> None:
    source = FakeRange(missing=range(0, 2))  # the first two steps too
    history = fetch(source, "q", start=START, end=START + 99 * STEP, step_s=STEP)
    assert history.rates[:2].tolist() == [12.0, 12.0]
    holes = FakeRange(missing=range(40, 50))
    history = fetch(holes, "q", start=START, end=START + 99 * STEP, step_s=STEP)
    assert [(gap.start, gap.steps) for gap in history.gaps] == [(START + 40 * STEP, 10)]
    assert history.rates[40:50] == pytest.approx([rate(START + k * STEP) for k in range(40, 50)])
    assert history.missing_steps == 10
    (line,) = describe_gaps(history)
    assert line == "gap: 10 step(s) from 2023-11-14 22:54 UTC, interpolated"


def test_more_than_one_series_or_none_at_all_is_an_error_saying_what_to_do() -> None:
    with pytest.raises(ExportError, match=r"returned 2 series; expected one \(wrap it in sum"):
        fetch(FakeRange(series=2), "q", start=START, end=START + 9 * STEP, step_s=STEP)
    with pytest.raises(ExportError, match="no samples in the range"):
        fetch(FakeRange(series=0), "q", start=START, end=START + 9 * STEP, step_s=STEP)
    with pytest.raises(ExportError, match="--since"):
        fetch(FakeRange(), "q", start=START, end=START + 0.5 * STEP, step_s=STEP)


def test_the_trace_holds_requests_per_step_from_zero_and_reads_back(tmp_path: Path) -> None:
    history = fetch(FakeRange(), "q", start=START + 1, end=START + 30 * STEP, step_s=STEP)
    path = tmp_path / "web.csv"
    write_trace(history, path)
    trace = read_trace(path)
    assert trace.interval_s == STEP
    assert trace.timestamps[0] == 0.0
    # The grid starts at the first multiple of the step at or after the start.
    assert history.start == START + STEP
    assert trace.counts[0] == rate(START + STEP) * STEP
