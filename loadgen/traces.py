"""The one reader of request-count traces (CSV `timestamp_s,requests`).

Used by trace replay (`loadgen.core.profiles.TraceProfile`), the simulator's scenarios and the
forecast backtest. Every row is validated against the format in `../shared/traces/README.md`
(a header, non-negative counts, a regular grid with no missing rows); an error names the
file, the line and what was expected, because a trace is outside input people edit by hand.
"""

from __future__ import annotations

import csv
import math
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

HEADER = ["timestamp_s", "requests"]


class TraceError(ValueError):
    """A trace that cannot be used; the message (and `line`, when known) names the line."""

    def __init__(self, message: str, *, line: int | None = None) -> None:
        super().__init__(message)
        self.line = line


@dataclass(frozen=True)
class Trace:
    timestamps: tuple[float, ...]
    counts: tuple[float, ...]
    interval_s: float  # the grid step (the median gap between rows)


def parse_trace(lines: Iterable[str], source: str) -> Trace:
    """Parse CSV text lines; `source` names the input in errors."""
    reader = csv.reader(line.lstrip("\ufeff") for line in lines)
    header = next(reader, None)
    if header is None or [cell.strip() for cell in header] != HEADER:
        raise _line_error(source, 1, "expected the header 'timestamp_s,requests'")
    timestamps: list[float] = []
    counts: list[float] = []
    interval = 0.0
    for line_number, row in enumerate(reader, start=2):
        if not row or all(not cell.strip() for cell in row):
            continue
        try:
            timestamp, count = _parse_row(row)
            if timestamps:
                interval = _checked_step(timestamps[-1], timestamp, interval)
        except ValueError as error:
            raise _line_error(source, line_number, str(error)) from None
        timestamps.append(timestamp)
        counts.append(count)
    if len(timestamps) < 2:
        raise TraceError(
            f"{source}: needs at least 2 data rows, found {len(timestamps)}",
            line=len(timestamps) + 2,
        )
    return Trace(tuple(timestamps), tuple(counts), interval)


def _line_error(source: str, line: int, message: str) -> TraceError:
    return TraceError(f"{source} line {line}: {message}", line=line)


def _parse_row(row: list[str]) -> tuple[float, float]:
    """(timestamp, count) of one data row; ValueError saying what was expected."""
    if len(row) != 2:
        raise ValueError(f"expected 2 fields (timestamp_s,requests), got {len(row)}")
    try:
        timestamp, count = float(row[0]), float(row[1])
    except ValueError:
        raise ValueError(f"expected two numbers, got {','.join(row)!r}") from None
    if not math.isfinite(timestamp):
        raise ValueError("timestamp_s must be a finite number")
    if not (math.isfinite(count) and count >= 0):
        raise ValueError(f"requests must be a finite count >= 0, got {row[1].strip()!r}")
    return timestamp, count


def _checked_step(previous: float, timestamp: float, interval: float) -> float:
    """The grid step after a row at `timestamp`; 0 `interval` means not yet known."""
    step = timestamp - previous
    if step <= 0:
        raise ValueError(f"timestamp_s must increase ({timestamp:g} after {previous:g})")
    if not interval:
        return step
    if not math.isclose(step, interval, rel_tol=1e-9, abs_tol=1e-6):
        raise ValueError(
            f"irregular step: {step:g} s after the previous row, expected {interval:g} s "
            "(the grid must be regular with no missing rows)"
        )
    return interval


def read_trace(path: Path) -> Trace:
    try:
        with path.open(newline="") as handle:
            return parse_trace(handle, str(path))
    except OSError as error:
        raise TraceError(f"{path}: cannot read the trace ({error.strerror})") from None
    except UnicodeDecodeError:
        raise TraceError(f"{path}: not a text CSV file") from None
