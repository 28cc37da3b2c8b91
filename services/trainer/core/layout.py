"""Where each parameter lives: named arrays split into pieces and spread over the pservers.

A model is a mapping of names to float32/float64 arrays of any shape. Every array is cut by
rows (its first axis) into pieces of at most `max_piece_bytes`, so any piece, its gradient
and its optimiser slots fit one NATS message; pieces go to the least-loaded pserver, largest
first. The layout is a pure function of the names, shapes, dtypes and the pserver count, so
every trainer and pserver computes the same one. Pure: numpy only.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

FLOAT_DTYPES = ("float32", "float64")
DEFAULT_MAX_PIECE_BYTES = 256 * 1024
NamedArrays = Mapping[str, npt.NDArray[Any]]


class LayoutError(ValueError):
    """Arrays that cannot be trained here; the message names the array and the problem."""


@dataclass(frozen=True)
class ArraySpec:
    name: str
    shape: tuple[int, ...]
    dtype: str  # "float32" | "float64"

    @property
    def rows(self) -> int:
        return self.shape[0] if self.shape else 1

    @property
    def row_bytes(self) -> int:
        per_row = int(np.prod(self.shape[1:], dtype=np.int64)) if len(self.shape) > 1 else 1
        return per_row * np.dtype(self.dtype).itemsize

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "shape": list(self.shape), "dtype": self.dtype}


@dataclass(frozen=True)
class Piece:
    """Rows [start, stop) of array `name`, held by pserver `server`."""

    id: int
    name: str
    start: int
    stop: int
    server: int


@dataclass(frozen=True)
class Layout:
    arrays: tuple[ArraySpec, ...]
    pieces: tuple[Piece, ...]
    servers: int

    def array(self, name: str) -> ArraySpec:
        for spec in self.arrays:
            if spec.name == name:
                return spec
        raise LayoutError(f"unknown array {name!r}; the model has {self.names}")

    @property
    def names(self) -> list[str]:
        return [spec.name for spec in self.arrays]

    def pieces_of(self, server: int) -> tuple[Piece, ...]:
        return tuple(piece for piece in self.pieces if piece.server == server)

    def pieces_named(self, name: str) -> tuple[Piece, ...]:
        return tuple(piece for piece in self.pieces if piece.name == name)

    def piece_bytes(self, piece: Piece) -> int:
        return (piece.stop - piece.start) * self.array(piece.name).row_bytes

    @property
    def total_bytes(self) -> int:
        return sum(self.piece_bytes(piece) for piece in self.pieces)

    def to_json(self) -> list[dict[str, Any]]:
        return [spec.to_json() for spec in self.arrays]


def describe(arrays: NamedArrays) -> tuple[ArraySpec, ...]:
    """Array specs in name order; raises LayoutError naming an unusable array."""
    if not arrays:
        raise LayoutError("the model has no arrays")
    specs = []
    for name in sorted(arrays):
        array = np.asarray(arrays[name])
        if not name or len(name) > 200:
            raise LayoutError(f"array name {name!r}: expected 1 to 200 characters")
        if array.dtype.name not in FLOAT_DTYPES:
            raise LayoutError(f"array {name!r}: dtype {array.dtype} is not one of {FLOAT_DTYPES}")
        if array.size == 0:
            raise LayoutError(f"array {name!r}: empty (shape {array.shape})")
        specs.append(ArraySpec(name, tuple(int(d) for d in array.shape), array.dtype.name))
    return tuple(specs)


def specs_from_json(data: Any) -> tuple[ArraySpec, ...]:
    """Array specs from `Layout.to_json`; raises LayoutError naming the bad entry."""
    if not isinstance(data, list) or not data:
        raise LayoutError("layout: expected a non-empty list of arrays")
    specs = []
    for index, entry in enumerate(data):
        if not isinstance(entry, dict):
            raise LayoutError(f"layout[{index}]: expected an object")
        name, shape, dtype = entry.get("name"), entry.get("shape"), entry.get("dtype")
        if not isinstance(name, str) or not name:
            raise LayoutError(f"layout[{index}].name: expected a non-empty string")
        if not isinstance(shape, list) or not all(
            isinstance(d, int) and not isinstance(d, bool) and 0 < d < 2**31 for d in shape
        ):
            raise LayoutError(f"layout[{index}].shape: expected positive integers, got {shape!r}")
        if dtype not in FLOAT_DTYPES:
            raise LayoutError(f"layout[{index}].dtype: expected one of {FLOAT_DTYPES}")
        specs.append(ArraySpec(name, tuple(shape), dtype))
    return tuple(sorted(specs, key=lambda spec: spec.name))


def plan(
    specs: tuple[ArraySpec, ...], servers: int, *, max_piece_bytes: int = DEFAULT_MAX_PIECE_BYTES
) -> Layout:
    """Cut arrays into row pieces of at most `max_piece_bytes` and balance them over servers."""
    if servers < 1:
        raise LayoutError(f"servers must be >= 1, got {servers}")
    cuts: list[tuple[str, int, int, int]] = []  # name, start, stop, bytes
    for spec in specs:
        if spec.row_bytes > max_piece_bytes:
            raise LayoutError(
                f"array {spec.name!r}: one row is {spec.row_bytes} bytes, more than a piece "
                f"({max_piece_bytes}); reshape it so rows are smaller"
            )
        rows_per_piece = max(1, max_piece_bytes // spec.row_bytes)
        for start in range(0, spec.rows, rows_per_piece):
            stop = min(spec.rows, start + rows_per_piece)
            cuts.append((spec.name, start, stop, (stop - start) * spec.row_bytes))
    load = [0] * servers
    owner: dict[tuple[str, int], int] = {}
    # Largest first onto the least-loaded server (ties: lowest index) balances bytes well.
    for name, start, _, size in sorted(cuts, key=lambda cut: (-cut[3], cut[0], cut[1])):
        server = min(range(servers), key=lambda index: (load[index], index))
        load[server] += size
        owner[(name, start)] = server
    pieces = tuple(
        Piece(index, name, start, stop, owner[(name, start)])
        for index, (name, start, stop, _) in enumerate(cuts)
    )
    return Layout(arrays=specs, pieces=pieces, servers=servers)


def check_state(layout: Layout, arrays: NamedArrays) -> None:
    """Raise LayoutError unless `arrays` has exactly the layout's names, shapes and dtypes."""
    given = describe(arrays)
    if given != layout.arrays:
        expected = {spec.name: (spec.shape, spec.dtype) for spec in layout.arrays}
        for spec in given:
            if expected.get(spec.name) != (spec.shape, spec.dtype):
                raise LayoutError(
                    f"array {spec.name!r}: {spec.shape} {spec.dtype} does not match the job's "
                    f"{expected.get(spec.name, 'nothing of that name')}"
                )
        missing = sorted(set(expected) - {spec.name for spec in given})
        raise LayoutError(f"arrays missing from the model: {missing}")


def check_job_state(job: str, layout: Layout, arrays: NamedArrays) -> None:
    """check_state, with a LayoutError naming both layouts and how to reset the job."""
    try:
        check_state(layout, arrays)
    except LayoutError as error:

        def text(specs: tuple[ArraySpec, ...]) -> str:
            return ", ".join(f"{s.name} {s.shape} {s.dtype}" for s in specs)

        raise LayoutError(
            f"job {job}: {error}. The job holds [{text(layout.arrays)}]; this trainer has "
            f"[{text(describe(arrays))}]. If the job's layout is the wrong one, stop the "
            f"trainers of that model, run `tideshift training reset --job {job}` (its "
            "coordinator and pservers start over on their own) and start the trainers again"
        ) from None


def rows_of(array: npt.NDArray[Any], piece: Piece) -> npt.NDArray[Any]:
    """The piece's rows of a full array (a 0-d array is its own single row)."""
    if array.ndim == 0:
        return array.reshape(1)
    return array[piece.start : piece.stop]
