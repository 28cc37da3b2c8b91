"""The pserver's binary messages: initial values, parameter pulls, chunked gradient pushes.

Every message carries pieces (see layout.py) as raw arrays next to a JSON header (wire.py).
A push larger than one message is cut into parts of whole piece updates; the pserver applies
a push only once all its parts arrived, so a batch is applied to all its pieces or none.
Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from tideshift.services.trainer.core.pserver_state import PieceUpdate
from tideshift.services.trainer.core.wire import WireError, header_int, header_str, pack, unpack

Array = npt.NDArray[Any]
MAX_PIECES_PER_MESSAGE = 4096
MAX_PUSH_ID = 200


def _piece_ids(header: Mapping[str, Any]) -> list[int]:
    ids = header.get("pieces")
    if (
        not isinstance(ids, list)
        or len(ids) > MAX_PIECES_PER_MESSAGE
        or not all(isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in ids)
    ):
        raise WireError(
            f"field 'pieces': expected up to {MAX_PIECES_PER_MESSAGE} non-negative integers"
        )
    return ids


def pack_pieces(header: Mapping[str, Any], values: Mapping[int, Array]) -> bytes:
    ids = sorted(values)
    return pack({**header, "pieces": ids}, {f"p{i}": values[i] for i in ids})


def unpack_pieces(raw: bytes) -> tuple[dict[str, Any], dict[int, Array]]:
    """A header and its pieces; raises WireError if a listed piece is missing."""
    header, arrays = unpack(raw)
    values = {}
    for piece in _piece_ids(header):
        value = arrays.get(f"p{piece}")
        if value is None:
            raise WireError(f"piece {piece} is listed but not sent")
        values[piece] = value
    return header, values


def update_bytes(update: PieceUpdate) -> int:
    arrays = (update.dense, update.indices, update.rows)
    return sum(array.nbytes for array in arrays if array is not None)


def split_updates(updates: Sequence[PieceUpdate], max_bytes: int) -> list[list[PieceUpdate]]:
    """Group whole piece updates into parts of at most `max_bytes` (one part at least)."""
    parts: list[list[PieceUpdate]] = [[]]
    size = 0
    for update in updates:
        cost = update_bytes(update)
        if parts[-1] and size + cost > max_bytes:
            parts.append([])
            size = 0
        parts[-1].append(update)
        size += cost
    return parts


@dataclass(frozen=True)
class PushPart:
    job: str
    push_id: str
    epoch: int
    shard: int
    batch: int
    last: bool
    part: int
    parts: int
    updates: tuple[PieceUpdate, ...]


def pack_push_part(
    *,
    job: str,
    push_id: str,
    epoch: int,
    shard: int,
    batch: int,
    last: bool,
    part: int,
    parts: int,
    updates: Iterable[PieceUpdate],
) -> bytes:
    entries: list[dict[str, Any]] = []
    arrays: dict[str, Array] = {}
    for update in updates:
        if update.dense is not None:
            entries.append({"piece": update.piece, "kind": "dense"})
            arrays[f"d{update.piece}"] = update.dense
        else:
            assert update.indices is not None and update.rows is not None
            entries.append({"piece": update.piece, "kind": "rows"})
            arrays[f"i{update.piece}"] = update.indices
            arrays[f"r{update.piece}"] = update.rows
    header = {
        "job": job,
        "push_id": push_id,
        "epoch": epoch,
        "shard": shard,
        "batch": batch,
        "last": last,
        "part": part,
        "parts": parts,
        "updates": entries,
    }
    return pack(header, arrays)


def _update_of(entry: Any, arrays: Mapping[str, Array]) -> PieceUpdate:
    if not isinstance(entry, dict):
        raise WireError("updates: each entry must be an object")
    piece = header_int(entry, "piece", minimum=0)
    kind = entry.get("kind")
    try:
        if kind == "dense":
            return PieceUpdate(piece, dense=arrays[f"d{piece}"])
        if kind == "rows":
            indices = arrays[f"i{piece}"]
            if indices.dtype != np.int64:
                raise WireError(f"piece {piece}: indices must be integers")
            return PieceUpdate(piece, indices=indices, rows=arrays[f"r{piece}"])
    except KeyError as error:
        raise WireError(f"piece {piece}: array {error.args[0]!r} missing") from error
    raise WireError(f"piece {piece}: kind must be 'dense' or 'rows', got {kind!r}")


def unpack_push_part(raw: bytes) -> PushPart:
    """Decode one part of a push; raises WireError naming the bad field."""
    header, arrays = unpack(raw)
    push_id = header_str(header, "push_id")
    if len(push_id) > MAX_PUSH_ID:
        raise WireError(f"field 'push_id': longer than {MAX_PUSH_ID} characters")
    parts = header_int(header, "parts", minimum=1)
    part = header_int(header, "part", minimum=0)
    if part >= parts or parts > MAX_PIECES_PER_MESSAGE:
        raise WireError(f"part {part} of {parts}: expected 0 <= part < parts <= 4096")
    last = header.get("last")
    if not isinstance(last, bool):
        raise WireError(f"field 'last': expected true or false, got {last!r}")
    entries = header.get("updates")
    if not isinstance(entries, list) or len(entries) > MAX_PIECES_PER_MESSAGE:
        raise WireError("field 'updates': expected a list of piece updates")
    return PushPart(
        job=header_str(header, "job"),
        push_id=push_id,
        epoch=header_int(header, "epoch", minimum=0),
        shard=header_int(header, "shard", minimum=0),
        batch=header_int(header, "batch", minimum=0),
        last=last,
        part=part,
        parts=parts,
        updates=tuple(_update_of(entry, arrays) for entry in entries),
    )
