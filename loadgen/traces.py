"""Reads request-count traces (CSV `timestamp_s,requests`) for `loadgen.profiles.TraceProfile`.

Every row is validated; an error names the file, the line and what was expected, because a
trace is outside input that people edit by hand.
"""

from __future__ import annotations

import csv
import itertools
import math
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

HEADER = ["timestamp_s", "requests"]


class TraceError(ValueError):
    """A trace that cannot be used; the message names the line."""


@dataclass(frozen=True)
class Trace:
    timestamps: tuple[float, ...]
    counts: tuple[float, ...]
    interval_s: float  # the grid step (the median gap between rows)


def parse_trace(lines: Iterable[str], source: str) -> Trace:
    """Parse CSV text lines; `source` names the input in errors."""
    reader = csv.reader(lines)
    header = next(reader, None)
    if header is None or [cell.strip() for cell in header] != HEADER:
        raise TraceError(f"{source} line 1: expected the header 'timestamp_s,requests'")
    timestamps: list[float] = []
    counts: list[float] = []
    for line_number, row in enumerate(reader, start=2):
        if not row or all(not cell.strip() for cell in row):
            continue
        if len(row) != 2:
            raise TraceError(
                f"{source} line {line_number}: expected 2 fields (timestamp_s,requests), "
                f"got {len(row)}"
            )
        try:
            timestamp, count = float(row[0]), float(row[1])
        except ValueError:
            raise TraceError(
                f"{source} line {line_number}: expected two numbers, got {','.join(row)!r}"
            ) from None
        if not math.isfinite(timestamp):
            raise TraceError(f"{source} line {line_number}: timestamp_s must be a finite number")
        if not (math.isfinite(count) and count >= 0):
            raise TraceError(
                f"{source} line {line_number}: requests must be a finite count >= 0, "
                f"got {row[1].strip()!r}"
            )
        if timestamps and timestamp <= timestamps[-1]:
            raise TraceError(
                f"{source} line {line_number}: timestamp_s must increase "
                f"({timestamp:g} after {timestamps[-1]:g})"
            )
        timestamps.append(timestamp)
        counts.append(count)
    if len(timestamps) < 2:
        raise TraceError(f"{source}: needs at least 2 data rows, found {len(timestamps)}")
    gaps = sorted(b - a for a, b in itertools.pairwise(timestamps))
    return Trace(tuple(timestamps), tuple(counts), gaps[len(gaps) // 2])


def read_trace(path: Path) -> Trace:
    try:
        with path.open(newline="") as handle:
            return parse_trace(handle, str(path))
    except OSError as error:
        raise TraceError(f"{path}: cannot read the trace ({error.strerror})") from None
    except UnicodeDecodeError:
        raise TraceError(f"{path}: not a text CSV file") from None
