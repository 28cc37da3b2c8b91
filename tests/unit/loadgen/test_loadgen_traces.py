"""The trace reader: valid files parse, bad lines are named."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.fixtures.requirements import shared_trace
from tideshift.loadgen.traces import TraceError, parse_trace, read_trace


def test_parses_rows_and_the_interval() -> None:
    trace = parse_trace(["timestamp_s,requests", "0,10", "60,12", "", "120,0"], "t.csv")
    assert trace.timestamps == (0.0, 60.0, 120.0)
    assert trace.counts == (10.0, 12.0, 0.0)
    assert trace.interval_s == 60.0


@pytest.mark.parametrize(
    ("lines", "message"),
    [
        (["time,count", "0,1"], "line 1: expected the header"),
        ([], "line 1: expected the header"),
        (["timestamp_s,requests", "0,1", "60"], "line 3: expected 2 fields"),
        (["timestamp_s,requests", "0,1", "60,abc"], "line 3: expected two numbers"),
        (["timestamp_s,requests", "0,1", "60,-3"], "line 3: requests must be a finite count"),
        (["timestamp_s,requests", "0,1", "60,nan"], "line 3: requests must be a finite count"),
        (["timestamp_s,requests", "60,1", "0,1"], "line 3: timestamp_s must increase"),
        (["timestamp_s,requests", "0,1"], "needs at least 2 data rows"),
    ],
)
def test_errors_name_the_line(lines: list[str], message: str) -> None:
    with pytest.raises(TraceError, match=message):
        parse_trace(lines, "t.csv")


def test_missing_file_is_one_clear_error(tmp_path: Path) -> None:
    with pytest.raises(TraceError, match="cannot read the trace"):
        read_trace(tmp_path / "absent.csv")


def test_reads_the_shared_nasa_trace() -> None:
    trace = read_trace(shared_trace("nasa_http_jul95_1min.csv"))
    assert trace.interval_s == 60.0
    assert max(trace.counts) == 405
