"""Talking to a job's parameter servers: initialise, pull, push a batch, ask status.

Each pserver holds some pieces of the model (core/layout.py). A pull asks every pserver for its
pieces in requests of at most `max_piece_bytes`-ish size and reassembles the named arrays;
a push cuts the batch's gradient into piece updates (dense rows or sparse rows) and sends
each pserver its own, in parts when they exceed one message. A batch is applied once every
pserver applied (or had already applied) it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np
import numpy.typing as npt

from tideshift.services.common.bus import Bus, RequestFailed
from tideshift.services.trainer.core.jobspec import JobSpec
from tideshift.services.trainer.core.layout import Layout, Piece, rows_of
from tideshift.services.trainer.core.messages import (
    pack_pieces,
    pack_push_part,
    split_updates,
    unpack_pieces,
)
from tideshift.services.trainer.core.pserver_state import MAX_OPEN_EPOCHS, PieceUpdate
from tideshift.services.trainer.core.wire import WireError, header_int, pack, unpack
from tideshift.services.trainer.port.bus import PServerOp, pserver_subject

Array = npt.NDArray[Any]
R = TypeVar("R")
PARTS_IN_FLIGHT = 8  # concurrent parts of one push to one pserver
SparseRows = tuple[Array, Array]  # (row indices, rows)
Gradient = Array | SparseRows


@dataclass(frozen=True)
class PushReply:
    index: int
    outcome: str  # applied | duplicate | rejected
    reason: str
    next_batch: int


@dataclass(frozen=True)
class PServerStatus:
    index: int
    initialised: bool
    version: int  # batches applied
    duplicates: int  # pushes refused because already applied
    retrained: int  # batches applied again after a restore lost them
    watermark: int
    generation: str  # of the model served (jobspec.StoredLayout.generation)
    applied: frozenset[tuple[int, int]]  # finished (epoch, shard), epochs >= from_epoch
    missing: frozenset[tuple[int, int]]  # unfinished pairs of epochs < from_epoch
    next_batch: int = 0
    finished: bool = False


def _unpack_reply(
    subject: str, raw: bytes, decode: Callable[[bytes], tuple[dict[str, Any], R]]
) -> tuple[dict[str, Any], R]:
    """A pserver's reply as `decode` reads it; RequestFailed for an error reply or a malformed
    one."""
    if raw.startswith(b"error: "):
        raise RequestFailed(f"{subject}: {raw.decode(errors='replace')}")
    try:
        header, arrays = decode(raw)
    except WireError as error:
        raise RequestFailed(f"{subject}: malformed reply: {error}") from error
    if (message := header.get("error")) is not None:
        raise RequestFailed(f"{subject}: {message}")
    return header, arrays


def _groups(layout: Layout, pieces: tuple[Piece, ...], max_bytes: int) -> list[list[Piece]]:
    groups: list[list[Piece]] = [[]]
    size = 0
    for piece in pieces:
        cost = layout.piece_bytes(piece)
        if groups[-1] and size + cost > max_bytes:
            groups.append([])
            size = 0
        groups[-1].append(piece)
        size += cost
    return groups


def piece_updates(
    layout: Layout, gradients: Mapping[str, Gradient]
) -> dict[int, list[PieceUpdate]]:
    """Updates per pserver; raises ValueError naming an unknown or misshapen gradient."""
    per_server: dict[int, list[PieceUpdate]] = {s: [] for s in range(layout.servers)}
    for name, gradient in gradients.items():
        spec = layout.array(name)
        if isinstance(gradient, tuple):
            indices = np.asarray(gradient[0], dtype=np.int64).reshape(-1)
            rows = np.asarray(gradient[1], dtype=spec.dtype)
            if rows.shape != (indices.shape[0], *spec.shape[1:]):
                raise ValueError(
                    f"gradient {name!r}: rows must have shape "
                    f"({indices.shape[0]}, {', '.join(map(str, spec.shape[1:]))}), got {rows.shape}"
                )
            for piece in layout.pieces_named(name):
                mask = (indices >= piece.start) & (indices < piece.stop)
                if mask.any():
                    update = PieceUpdate(
                        piece.id, indices=indices[mask] - piece.start, rows=rows[mask]
                    )
                    per_server[piece.server].append(update)
            continue
        dense = np.asarray(gradient, dtype=spec.dtype)
        if dense.shape != spec.shape:
            raise ValueError(f"gradient {name!r}: expected shape {spec.shape}, got {dense.shape}")
        for piece in layout.pieces_named(name):
            per_server[piece.server].append(PieceUpdate(piece.id, dense=rows_of(dense, piece)))
    return per_server


class StatusClient:
    """Asks a job's pservers what they applied (all the coordinator needs)."""

    def __init__(self, bus: Bus, spec: JobSpec, *, timeout: float = 5.0) -> None:
        self.bus = bus
        self.spec = spec
        self.timeout = timeout

    def _subject(self, index: int, op: PServerOp) -> str:
        return pserver_subject(self.spec.job, index, op)

    async def _status_of(
        self, index: int, from_epoch: int, position: tuple[int, int] | None
    ) -> PServerStatus:
        subject = self._subject(index, "status")
        request: dict[str, Any] = {
            "job": self.spec.job,
            "from_epoch": from_epoch,
            "shards": self.spec.num_shards,
        }
        if position is not None:
            request["epoch"], request["shard"] = position
        raw = await self.bus.request(subject, pack(request), timeout=self.timeout)
        header, arrays = _unpack_reply(subject, raw, unpack)
        applied, missing = arrays.get("applied"), arrays.get("missing")
        for name, pairs in (("applied", applied), ("missing", missing)):
            if pairs is None or pairs.ndim != 2 or pairs.shape[1] != 2:
                raise RequestFailed(f"{subject}: {name} must have shape (n, 2)")
        assert applied is not None and missing is not None
        try:
            watermark = header_int(header, "watermark", minimum=0)
            # Epochs below the watermark are finished and no longer listed one by one.
            below = range(from_epoch, min(watermark, from_epoch + MAX_OPEN_EPOCHS))
            finished = {(e, s) for e in below for s in range(self.spec.num_shards)}
            return PServerStatus(
                index=index,
                initialised=bool(header.get("initialised")),
                version=header_int(header, "version", minimum=0),
                duplicates=header_int(header, "duplicates", minimum=0),
                retrained=header_int(header, "retrained", minimum=0),
                watermark=watermark,
                generation=str(header.get("generation", "")),
                applied=frozenset((int(e), int(s)) for e, s in applied) | finished,
                missing=frozenset((int(e), int(s)) for e, s in missing),
                next_batch=int(header.get("next_batch", 0)),
                finished=bool(header.get("finished", False)),
            )
        except WireError as error:
            raise RequestFailed(f"{subject}: {error}") from error

    async def status(
        self, *, from_epoch: int = 0, position: tuple[int, int] | None = None
    ) -> list[PServerStatus]:
        return list(
            await asyncio.gather(
                *(
                    self._status_of(index, from_epoch, position)
                    for index in range(self.spec.pservers)
                )
            )
        )


class PServerClient(StatusClient):
    """Initialise, pull and push the named arrays of a model laid out over the pservers."""

    def __init__(self, bus: Bus, spec: JobSpec, layout: Layout, *, timeout: float = 5.0) -> None:
        super().__init__(bus, spec, timeout=timeout)
        self.layout = layout

    async def initialise(self, arrays: Mapping[str, Array]) -> None:
        """Offer initial values to every pserver (each keeps the first complete set)."""
        for index in range(self.layout.servers):
            owned = self.layout.pieces_of(index)
            for group in _groups(self.layout, owned, self.spec.max_piece_bytes):
                values = {
                    piece.id: rows_of(np.asarray(arrays[piece.name]), piece) for piece in group
                }
                subject = self._subject(index, "init")
                raw = await self.bus.request(
                    subject, pack_pieces({"job": self.spec.job}, values), timeout=self.timeout
                )
                _unpack_reply(subject, raw, unpack)

    async def _pull_group(self, index: int, group: list[Piece]) -> dict[int, Array]:
        subject = self._subject(index, "params")
        payload = pack({"job": self.spec.job, "pieces": [piece.id for piece in group]})
        raw = await self.bus.request(subject, payload, timeout=self.timeout)
        _, values = _unpack_reply(subject, raw, unpack_pieces)
        return values

    async def pull(self) -> dict[str, Array]:
        """Every named array; raises RequestFailed if a pserver does not answer."""
        requests = [
            self._pull_group(index, group)
            for index in range(self.layout.servers)
            for group in _groups(
                self.layout, self.layout.pieces_of(index), self.spec.max_piece_bytes
            )
        ]
        values: dict[int, Array] = {}
        for part in await asyncio.gather(*requests):
            values.update(part)
        arrays: dict[str, Array] = {}
        for spec in self.layout.arrays:
            pieces = self.layout.pieces_named(spec.name)
            try:
                joined = np.concatenate([values[piece.id] for piece in pieces])
            except KeyError as error:
                raise RequestFailed(f"piece {error.args[0]} missing from the pull") from error
            if joined.size != int(np.prod(spec.shape, dtype=np.int64)):
                raise RequestFailed(f"array {spec.name!r}: pulled {joined.size} values")
            arrays[spec.name] = joined.reshape(spec.shape)
        return arrays

    async def _push_to(
        self,
        index: int,
        updates: list[PieceUpdate],
        *,
        push_id: str,
        epoch: int,
        shard: int,
        batch: int,
        last: bool,
    ) -> PushReply:
        subject = self._subject(index, "push")
        parts = split_updates(updates, self.spec.max_piece_bytes)
        in_flight = asyncio.Semaphore(PARTS_IN_FLIGHT)

        async def send(number: int, part: list[PieceUpdate]) -> dict[str, Any]:
            payload = pack_push_part(
                job=self.spec.job,
                push_id=f"{push_id}/{index}",
                epoch=epoch,
                shard=shard,
                batch=batch,
                last=last,
                part=number,
                parts=len(parts),
                updates=part,
            )
            async with in_flight:
                raw = await self.bus.request(subject, payload, timeout=self.timeout)
            header, _ = _unpack_reply(subject, raw, unpack)
            return header

        # Parts travel concurrently; the reply to whichever completes the push carries the
        # outcome, the others say "partial".
        replies = await asyncio.gather(*(send(n, part) for n, part in enumerate(parts)))
        header = next((r for r in replies if r.get("outcome") != "partial"), replies[-1])
        return PushReply(
            index=index,
            outcome=str(header.get("outcome")),
            reason=str(header.get("reason", "")),
            next_batch=int(header.get("next_batch", 0)),
        )

    async def push(
        self,
        gradients: Mapping[str, Gradient],
        *,
        push_id: str,
        epoch: int,
        shard: int,
        batch: int,
        last: bool,
        answered: dict[int, PushReply] | None = None,
    ) -> list[PushReply]:
        """Send the batch to every pserver not yet in `answered` (an empty update still
        records the batch), adding their replies to it; RequestFailed if one did not answer.

        A retry passes the same `answered`, so a pserver that applied the batch is not asked
        again and does not turn its own earlier push into a duplicate."""
        answered = {} if answered is None else answered
        per_server = piece_updates(self.layout, gradients)
        pending = [index for index in per_server if index not in answered]
        replies = await asyncio.gather(
            *(
                self._push_to(
                    index,
                    per_server[index],
                    push_id=push_id,
                    epoch=epoch,
                    shard=shard,
                    batch=batch,
                    last=last,
                )
                for index in pending
            ),
            return_exceptions=True,
        )
        for index, reply in zip(pending, replies, strict=True):
            if isinstance(reply, PushReply):
                answered[index] = reply
        for reply in replies:
            if isinstance(reply, BaseException):
                raise reply
        return [answered[index] for index in sorted(answered)]
