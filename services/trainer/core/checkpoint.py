"""Pserver checkpoints as bytes: pieces, optimiser slots and the ledger together, so a
restore can never pair parameters with a ledger they do not reflect. Pure."""

from __future__ import annotations

from typing import Any

import numpy as np
from pydantic import ValidationError

from tideshift.services.trainer.core.layout import LayoutError, specs_from_json
from tideshift.services.trainer.core.optim import OptimizerSpec
from tideshift.services.trainer.core.pserver_state import Ledger, PieceState, PServerState
from tideshift.services.trainer.core.wire import WireError, header_int, pack, unpack

FORMAT_VERSION = 2


def encode_checkpoint(state: PServerState) -> bytes:
    ledger = state.ledger
    positions = np.array(
        [
            (epoch, shard, next_batch, int(ledger.is_finished(epoch, shard)))
            for (epoch, shard), next_batch in sorted(ledger.next_batch.items())
        ],
        dtype=np.int64,
    ).reshape(-1, 4)
    arrays: dict[str, np.ndarray] = {"positions": positions}
    steps = []
    for piece_id, piece in sorted(state.pieces.items()):
        arrays[f"p{piece_id}"] = piece.params
        for slot, value in piece.slots.items():
            arrays[f"p{piece_id}.{slot}"] = value
        steps.append((piece_id, piece.steps))
    arrays["steps"] = np.array(steps, dtype=np.int64).reshape(-1, 2)
    return pack(
        {
            "format": FORMAT_VERSION,
            "index": state.index,
            "initialised": state.initialised,
            "layout": state.layout.to_json(),
            "servers": state.layout.servers,
            "optimizer": state.optimizer.model_dump(),
            "watermark": ledger.watermark,
            "applied_batches": ledger.applied_batches,
            "duplicates": ledger.duplicates,
            "high_water": ledger.high_water,
            "retrained": ledger.retrained,
            "num_shards": ledger.num_shards,
        },
        arrays,
    )


def decode_checkpoint(payload: bytes, *, expected: PServerState) -> PServerState:
    """Restore a checkpoint made for the same layout, pserver and shard count as `expected`
    (a fresh state); raises WireError naming what differs or is malformed."""
    header, arrays = unpack(payload)
    if header_int(header, "format") != FORMAT_VERSION:
        raise WireError(f"checkpoint format {header.get('format')} is not {FORMAT_VERSION}")
    try:
        specs = specs_from_json(header.get("layout"))
    except LayoutError as error:
        raise WireError(f"checkpoint: {error}") from error
    if specs != expected.layout.arrays or header.get("servers") != expected.layout.servers:
        raise WireError("checkpoint: made for another model layout or pserver count")
    if header_int(header, "index") != expected.index:
        raise WireError(f"checkpoint is of pserver {header.get('index')}, not {expected.index}")
    if header_int(header, "num_shards") != expected.ledger.num_shards:
        raise WireError("checkpoint: made for another shard count")
    ledger = _decode_ledger(header, arrays, expected.ledger.num_shards)
    steps = {int(piece): int(count) for piece, count in arrays.get("steps", np.zeros((0, 2)))}
    pieces: dict[int, PieceState] = {}
    for piece in expected.owned():
        params = arrays.get(f"p{piece.id}")
        if params is None:
            break  # checkpointed before initialisation
        slots = {
            slot: np.array(arrays[f"p{piece.id}.{slot}"])
            for slot in expected.optimizer.slot_names
            if f"p{piece.id}.{slot}" in arrays
        }
        if len(slots) != len(expected.optimizer.slot_names):
            raise WireError(f"checkpoint: piece {piece.id} lacks optimiser slots")
        pieces[piece.id] = PieceState(piece, np.array(params), slots, steps.get(piece.id, 0))
    try:
        optimizer = OptimizerSpec.model_validate(header.get("optimizer"))
    except ValidationError as error:
        raise WireError(f"checkpoint: optimizer: {error}") from error
    return PServerState(
        layout=expected.layout,
        index=expected.index,
        optimizer=optimizer,
        ledger=ledger,
        pieces=pieces,
        # Older checkpoints lack the flag: they were initialised if they hold pieces.
        initialised=bool(header.get("initialised", bool(pieces))),
    )


def _decode_ledger(header: dict[str, Any], arrays: dict[str, Any], num_shards: int) -> Ledger:
    ledger = Ledger(
        num_shards=num_shards,
        watermark=header_int(header, "watermark", minimum=0),
        applied_batches=header_int(header, "applied_batches", minimum=0),
        duplicates=header_int(header, "duplicates", minimum=0),
        # Absent from checkpoints written before re-training was counted: none counted then.
        high_water=header_int(header, "high_water", minimum=0) if "high_water" in header else 0,
        retrained=header_int(header, "retrained", minimum=0) if "retrained" in header else 0,
    )
    positions = arrays.get("positions")
    if positions is None or positions.ndim != 2 or positions.shape[1] != 4:
        raise WireError("checkpoint: positions must have shape (n, 4)")
    for epoch, shard, next_batch, finished in positions.tolist():
        ledger.next_batch[(epoch, shard)] = next_batch
        if finished:
            ledger.finished.setdefault(epoch, set()).add(shard)
    return ledger
