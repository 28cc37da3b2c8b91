"""What one pserver holds and decides: its pieces of the model with their optimiser slots,
and the ledger that applies every (epoch, shard, batch) exactly once.

Ledger rule: within a shard, batches are applied in order. A push of the shard's next batch
is applied; an earlier one (or one of a finished shard or epoch) is a duplicate, refused and
counted; a later one is a gap and rejected, so the trainer resumes at `next`. A push marked
`last` finishes the shard. When every shard of the oldest open epoch is finished the
watermark moves past it and its entries are dropped, so memory and time per push stay
constant however many epochs a job runs. A pserver restored from a checkpoint older than
what it had applied counts the applies that climb back to that count as re-trained.
Pure: numpy only; updates mutate this state.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

import numpy as np
import numpy.typing as npt

from tideshift.services.trainer.core.layout import Layout, Piece
from tideshift.services.trainer.core.optim import (
    GradientRejected,
    OptimizerSpec,
    apply_dense,
    apply_rows,
    check_dense,
    check_rows,
    new_slots,
)

Array = npt.NDArray[Any]
TaskKey = tuple[int, int]  # (epoch, shard)
MAX_OPEN_EPOCHS = 4  # epochs at or above the watermark a pserver accepts or reports on


class PushOutcome(StrEnum):
    APPLIED = "applied"
    DUPLICATE = "duplicate"  # already applied: refused, counted; the trainer moves on
    REJECTED = "rejected"  # bad or out-of-order input: the parameters were not touched


@dataclass(frozen=True)
class PieceUpdate:
    """A gradient for one piece: dense rows, or sparse rows at piece-relative indices."""

    piece: int
    dense: Array | None = None
    indices: Array | None = None
    rows: Array | None = None


@dataclass(frozen=True)
class GradientPush:
    epoch: int
    shard: int
    batch: int
    last: bool  # the shard's final batch: the shard is finished once applied
    updates: tuple[PieceUpdate, ...]


@dataclass(frozen=True)
class PushResult:
    outcome: PushOutcome
    reason: str = ""
    next_batch: int = 0  # the shard's first batch not yet applied here


@dataclass
class Ledger:
    num_shards: int
    watermark: int = 0  # every epoch below is finished (all shards, all batches)
    next_batch: dict[TaskKey, int] = field(default_factory=dict)
    finished: dict[int, set[int]] = field(default_factory=dict)  # epoch -> finished shards
    applied_batches: int = 0
    duplicates: int = 0
    # Batches this pserver had applied before restoring an older checkpoint (the most it is
    # known to have applied, from its progress record); applies below it are re-training.
    high_water: int = 0
    retrained: int = 0

    def is_finished(self, epoch: int, shard: int) -> bool:
        return epoch < self.watermark or shard in self.finished.get(epoch, set())

    def position(self, epoch: int, shard: int) -> tuple[int, bool]:
        """(first batch not yet applied, whether the shard is finished)."""
        if self.is_finished(epoch, shard):
            return self.next_batch.get((epoch, shard), 0), True
        return self.next_batch.get((epoch, shard), 0), False

    def check(self, epoch: int, shard: int, batch: int) -> PushResult | None:
        """Why this batch must not be applied now, or None to apply it."""
        if epoch < 0 or batch < 0 or not 0 <= shard < self.num_shards:
            return PushResult(
                PushOutcome.REJECTED,
                f"epoch, batch must be >= 0 and shard in [0, {self.num_shards}); "
                f"got epoch={epoch} shard={shard} batch={batch}",
            )
        if epoch >= self.watermark + MAX_OPEN_EPOCHS:
            return PushResult(
                PushOutcome.REJECTED,
                f"epoch {epoch} is too far ahead: epochs below {self.watermark} are finished "
                f"and at most {MAX_OPEN_EPOCHS} are open",
            )
        expected, finished = self.position(epoch, shard)
        if finished or batch < expected:
            self.duplicates += 1
            return PushResult(
                PushOutcome.DUPLICATE,
                f"epoch {epoch} shard {shard} batch {batch} already applied",
                expected,
            )
        if batch > expected:
            return PushResult(
                PushOutcome.REJECTED,
                f"epoch {epoch} shard {shard}: batch {batch} pushed before batch {expected}",
                expected,
            )
        return None

    def record(self, epoch: int, shard: int, batch: int, *, last: bool) -> None:
        self.next_batch[(epoch, shard)] = batch + 1
        if self.applied_batches < self.high_water:
            self.retrained += 1
        self.applied_batches += 1
        if last:
            self.finished.setdefault(epoch, set()).add(shard)
            self._advance()

    def _advance(self) -> None:
        while len(self.finished.get(self.watermark, ())) == self.num_shards:
            done = self.watermark
            for shard in range(self.num_shards):
                self.next_batch.pop((done, shard), None)
            del self.finished[done]
            self.watermark += 1

    def finished_from(self, from_epoch: int) -> list[TaskKey]:
        """Finished (epoch, shard) pairs of open epochs >= from_epoch."""
        return sorted(
            (epoch, shard)
            for epoch, shards in self.finished.items()
            if epoch >= from_epoch
            for shard in shards
        )

    def missing_before(self, from_epoch: int) -> list[TaskKey]:
        """Unfinished pairs of epochs below `from_epoch` (bounded: open epochs only)."""
        return [
            (epoch, shard)
            for epoch in range(self.watermark, min(from_epoch, self.watermark + MAX_OPEN_EPOCHS))
            for shard in range(self.num_shards)
            if shard not in self.finished.get(epoch, set())
        ]


@dataclass
class PieceState:
    piece: Piece
    params: Array
    slots: dict[str, Array]
    steps: int = 0  # updates applied to this piece (Adam's bias correction)


@dataclass
class PServerState:
    """One pserver's pieces (empty until the job is initialised) and ledger."""

    layout: Layout
    index: int
    optimizer: OptimizerSpec
    ledger: Ledger
    pieces: dict[int, PieceState] = field(default_factory=dict)
    # A flag, not "holds pieces": a model smaller than the pservers leaves some with none,
    # and they must still count as initialised (the job once hung waiting for them).
    initialised: bool = False

    def owned(self) -> tuple[Piece, ...]:
        return self.layout.pieces_of(self.index)

    def initialise(self, values: dict[int, Array]) -> None:
        """Take the initial parameters of every owned piece; raises ValueError if one is
        missing or misshapen."""
        pieces: dict[int, PieceState] = {}
        for piece in self.owned():
            value = values.get(piece.id)
            spec = self.layout.array(piece.name)
            shape = (piece.stop - piece.start, *spec.shape[1:])
            if value is None or value.shape != shape:
                raise ValueError(f"piece {piece.id} ({piece.name!r}): expected shape {shape}")
            if not np.all(np.isfinite(value)):
                raise ValueError(f"piece {piece.id} ({piece.name!r}): non-finite values")
            params = np.array(value, dtype=spec.dtype)
            pieces[piece.id] = PieceState(piece, params, new_slots(self.optimizer, params))
        self.pieces = pieces
        self.initialised = True

    def _validate(self, update: PieceUpdate) -> None:
        state = self.pieces.get(update.piece)
        if state is None:
            raise GradientRejected(f"piece {update.piece} is not held by pserver {self.index}")
        what = f"piece {update.piece} ({state.piece.name!r})"
        if update.dense is not None:
            check_dense(state.params, update.dense, what)
        elif update.indices is not None and update.rows is not None:
            check_rows(state.params, update.indices, update.rows, what)
        else:
            raise GradientRejected(f"{what}: neither a dense gradient nor (indices, rows)")

    def push(self, push: GradientPush) -> PushResult:
        """Apply the batch's updates to every piece, or to none."""
        if not self.initialised:
            return PushResult(PushOutcome.REJECTED, "the job's parameters are not initialised")
        refusal = self.ledger.check(push.epoch, push.shard, push.batch)
        if refusal is not None:
            return refusal
        try:
            for update in push.updates:
                self._validate(update)
        except GradientRejected as error:
            return PushResult(PushOutcome.REJECTED, str(error))
        for update in push.updates:
            state = self.pieces[update.piece]
            state.steps += 1
            if update.dense is not None:
                apply_dense(self.optimizer, state.params, state.slots, update.dense, state.steps)
            else:
                assert update.indices is not None and update.rows is not None
                apply_rows(
                    self.optimizer,
                    state.params,
                    state.slots,
                    update.indices,
                    update.rows,
                    state.steps,
                )
        self.ledger.record(push.epoch, push.shard, push.batch, last=push.last)
        return PushResult(PushOutcome.APPLIED, next_batch=push.batch + 1)
