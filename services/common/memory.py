"""Handing memory a service freed back to the operating system."""

from __future__ import annotations

import contextlib
import copy
import ctypes
import sys
from typing import Any, TypeVar

Table = TypeVar("Table", bound=dict[Any, Any] | set[Any])


def release_freed_memory() -> None:
    """glibc keeps what Python freed in its arenas (RSS stayed ~3 MB per removed workload in
    the predictor, and hundreds of MB in the planner after a flood's backlog was applied,
    measured): malloc_trim returns it to the OS. Without glibc (musl, macOS) there is nothing
    to call. Takes milliseconds: call it off the event loop, after large frees."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6").malloc_trim(0)


# A table smaller than this is left as it is (the copy would save next to nothing).
_COMPACT_FROM_BYTES = 64 * 1024
# More bytes than this per entry means most of its slots are empty: a dict or set built for
# what it holds takes 30-110 bytes per entry (measured with sys.getsizeof, CPython 3.11).
_COMPACT_BYTES_PER_ENTRY = 256


def compacted(table: Table) -> Table:
    """`table`, or a copy sized for what it holds (in the same order) when most of its slots
    are empty. CPython never shrinks a dict or a set as entries are deleted: one that held a
    flood of 200,000 names keeps 10 MB of empty slots once they are all gone (measured), so a
    service whose state is keyed by outside names rebinds its tables to this now and then."""
    size = sys.getsizeof(table)
    if size < _COMPACT_FROM_BYTES or size < _COMPACT_BYTES_PER_ENTRY * len(table):
        return table
    return copy.copy(table)  # dict.copy / set.copy: the same type, in the same order


def compact_tables(owner: object) -> None:
    """Rebind each dict or set attribute of `owner` to `compacted(it)`. For objects that own
    their tables (none is shared with another object, which would keep the old one)."""
    for name, value in list(vars(owner).items()):
        if isinstance(value, dict | set):
            setattr(owner, name, compacted(value))
