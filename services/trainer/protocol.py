"""The training job's state machines: the coordinator's epoch/shard progress and the pserver's
at-most-once apply. Pure: inputs are observations, outputs are decisions; no I/O, no clock.

Coordinator rule (level-triggered, so a restart only has to reload its last persisted state):
  * every shard of the current epoch is published once per *round*;
  * when every pserver has applied every shard of the epoch, the next epoch starts;
  * when the work queue is empty but shards of the epoch are still unapplied, the work was
    lost (a pserver restored an older checkpoint after its applies were acked): the missing
    shards are published again in a new round. Duplicates are harmless: the pserver applies
    each (epoch, shard) at most once.
The caller must read the queue depth *before* the applied sets: a task leaves the queue
only after its gradient was applied, so "empty queue, then not applied" means lost.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from enum import StrEnum
from typing import Any

import numpy as np

from services.trainer.model import (
    FloatArray,
    GradientRejected,
    KeyRange,
    OptimizerState,
    apply_gradient,
)

TaskKey = tuple[int, int]  # (epoch, shard)


# ---------------------------------------------------------------------------------------------
# Coordinator


@dataclass(frozen=True)
class TaskSpec:
    """One unit of work: compute the gradient of ``shard`` for ``epoch``."""

    epoch: int
    shard: int
    round: int  # republish generation; part of the message id so republishes are not deduped

    def message_id(self, job: str) -> str:
        return f"{job}.{self.epoch}.{self.shard}.{self.round}"


@dataclass(frozen=True)
class Observation:
    """What the coordinator sees in one tick."""

    queued_tasks: int  # messages in the job's work queue (read first)
    applied: frozenset[TaskKey]  # (epoch, shard) applied by every pserver (read second)


@dataclass(frozen=True)
class Decision:
    publish: tuple[TaskSpec, ...] = ()
    completed_epochs: tuple[int, ...] = ()  # epochs that finished in this step
    republished: int = 0  # tasks published again because their work was lost
    finished: bool = False


@dataclass(frozen=True)
class CoordinatorState:
    job: str
    num_shards: int
    epochs: int | None  # None: keep training until stopped
    epoch: int = 0
    round: int = 0
    published: frozenset[int] = frozenset()  # shards of `epoch` published in any round
    applied: frozenset[int] = frozenset()  # shards of `epoch` applied, as last observed
    republished: int = 0
    finished: bool = False

    def __post_init__(self) -> None:
        if self.num_shards < 1:
            raise ValueError(f"num_shards must be >= 1, got {self.num_shards}")
        if self.epochs is not None and self.epochs < 1:
            raise ValueError(f"epochs must be >= 1, got {self.epochs}")

    @property
    def all_shards(self) -> frozenset[int]:
        return frozenset(range(self.num_shards))

    def to_json(self) -> dict[str, Any]:
        return {
            "job": self.job,
            "num_shards": self.num_shards,
            "epochs": self.epochs,
            "epoch": self.epoch,
            "round": self.round,
            "published": sorted(self.published),
            "applied": sorted(self.applied),
            "republished": self.republished,
            "finished": self.finished,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> CoordinatorState:
        """Rebuild a persisted state; raises ValueError naming a bad field."""
        try:
            epochs = data["epochs"]
            state = cls(
                job=str(data["job"]),
                num_shards=int(data["num_shards"]),
                epochs=None if epochs is None else int(epochs),
                epoch=int(data["epoch"]),
                round=int(data["round"]),
                published=frozenset(int(s) for s in data["published"]),
                applied=frozenset(int(s) for s in data["applied"]),
                republished=int(data["republished"]),
                finished=bool(data["finished"]),
            )
        except KeyError as error:
            raise ValueError(f"coordinator state: missing field {error.args[0]!r}") from error
        except (TypeError, ValueError) as error:
            raise ValueError(f"coordinator state: {error}") from error
        if not state.published <= state.all_shards or not state.applied <= state.all_shards:
            raise ValueError(f"coordinator state: shard out of range [0, {state.num_shards})")
        return state


def new_coordinator(job: str, *, num_shards: int, epochs: int | None) -> CoordinatorState:
    return CoordinatorState(job=job, num_shards=num_shards, epochs=epochs)


def resume_coordinator(
    persisted: CoordinatorState | None, *, job: str, num_shards: int, epochs: int | None
) -> CoordinatorState:
    """The state to start from after a (re)start; raises ValueError on a mismatched job.

    A changed ``--epochs`` is honoured (train longer or stop earlier); a changed shard count
    is refused because the applied sets would no longer mean the same data.
    """
    if persisted is None:
        return new_coordinator(job, num_shards=num_shards, epochs=epochs)
    if persisted.job != job:
        raise ValueError(f"persisted state is for job {persisted.job!r}, not {job!r}")
    if persisted.num_shards != num_shards:
        raise ValueError(
            f"job {job!r} was started with {persisted.num_shards} shards, not {num_shards}"
        )
    finished = persisted.finished and epochs is not None and persisted.epoch + 1 >= epochs
    return replace(persisted, epochs=epochs, finished=finished)


def step(state: CoordinatorState, observation: Observation) -> tuple[CoordinatorState, Decision]:
    """Advance on one observation; returns the new state and what to publish."""
    if state.finished:
        return state, Decision(finished=True)
    completed: list[int] = []
    republished = 0
    while True:
        applied = frozenset(s for (e, s) in observation.applied if e == state.epoch)
        state = replace(state, applied=applied & state.all_shards)
        if state.applied != state.all_shards:
            break
        completed.append(state.epoch)
        if state.epochs is not None and state.epoch + 1 >= state.epochs:
            state = replace(state, finished=True)
            return state, Decision(completed_epochs=tuple(completed), finished=True)
        state = replace(
            state, epoch=state.epoch + 1, round=0, published=frozenset(), applied=frozenset()
        )
    unpublished = state.all_shards - state.published - state.applied
    if not unpublished and observation.queued_tasks == 0 and not completed:
        # Everything was published, nothing is queued, yet shards are unapplied: lost work.
        unpublished = state.all_shards - state.applied
        state = replace(state, round=state.round + 1)
        republished = len(unpublished)
    tasks = tuple(TaskSpec(state.epoch, shard, state.round) for shard in sorted(unpublished))
    return state, Decision(
        publish=tasks, completed_epochs=tuple(completed), republished=republished
    )


def mark_published(state: CoordinatorState, tasks: Iterable[TaskSpec]) -> CoordinatorState:
    """Record tasks the work queue has acknowledged; tasks of other epochs are ignored."""
    shards = frozenset(task.shard for task in tasks if task.epoch == state.epoch)
    republished = sum(1 for task in tasks if task.epoch == state.epoch and task.round > 0)
    return replace(
        state,
        published=state.published | shards,
        republished=state.republished + republished,
    )


def progress_fraction(state: CoordinatorState) -> float:
    """Share of the whole job done, for progress events (0 when the epoch count is open)."""
    if state.epochs is None:
        return 0.0
    if state.finished:
        return 1.0
    done = state.epoch * state.num_shards + len(state.applied)
    return done / (state.epochs * state.num_shards)


# ---------------------------------------------------------------------------------------------
# Parameter server


class PushOutcome(StrEnum):
    APPLIED = "applied"
    DUPLICATE = "duplicate"  # already applied: the trainer should ack and move on
    REJECTED = "rejected"  # bad input: the parameters were not touched


@dataclass(frozen=True)
class GradientPush:
    job: str
    epoch: int
    shard: int
    delivery: int  # JetStream delivery attempt of the task (1 = first)
    key_range: KeyRange
    gradient: FloatArray


@dataclass(frozen=True)
class PushResult:
    outcome: PushOutcome
    reason: str = ""


@dataclass(frozen=True)
class PServerState:
    job: str
    optimizer: OptimizerState
    # (epoch, shard) -> the delivery attempt whose gradient was applied
    applied: Mapping[TaskKey, int] = field(default_factory=dict)
    version: int = 0  # number of gradients applied

    @property
    def redelivered(self) -> int:
        """Deliveries beyond the first that preceded an applied gradient."""
        return sum(delivery - 1 for delivery in self.applied.values())

    def applied_in(self, epoch: int) -> frozenset[int]:
        return frozenset(s for (e, s) in self.applied if e == epoch)


def handle_push(
    state: PServerState, push: GradientPush, *, learning_rate: float
) -> tuple[PServerState, PushResult]:
    """Apply ``push`` unless it is a duplicate or bad; the state is untouched unless applied."""
    if push.job != state.job:
        return state, PushResult(
            PushOutcome.REJECTED, f"unknown job {push.job!r}: this pserver serves {state.job!r}"
        )
    if push.epoch < 0 or push.shard < 0:
        return state, PushResult(
            PushOutcome.REJECTED,
            f"epoch and shard must be >= 0, got epoch={push.epoch} shard={push.shard}",
        )
    if push.delivery < 1:
        return state, PushResult(
            PushOutcome.REJECTED, f"delivery must be >= 1, got {push.delivery}"
        )
    owned = state.optimizer.key_range
    if push.key_range != owned:
        return state, PushResult(
            PushOutcome.REJECTED,
            f"key range [{push.key_range.start}, {push.key_range.stop}) does not match "
            f"this pserver's [{owned.start}, {owned.stop})",
        )
    key = (push.epoch, push.shard)
    if key in state.applied:
        return state, PushResult(
            PushOutcome.DUPLICATE, f"epoch {push.epoch} shard {push.shard} already applied"
        )
    try:
        optimizer = apply_gradient(state.optimizer, push.gradient, learning_rate=learning_rate)
    except GradientRejected as error:
        return state, PushResult(PushOutcome.REJECTED, str(error))
    applied = dict(state.applied)
    applied[key] = push.delivery
    return (
        PServerState(
            job=state.job, optimizer=optimizer, applied=applied, version=state.version + 1
        ),
        PushResult(PushOutcome.APPLIED),
    )


def applied_everywhere(applied_sets: Iterable[Iterable[TaskKey]]) -> frozenset[TaskKey]:
    """(epoch, shard) pairs applied by every pserver of the job (a shard counts once all
    key ranges took its gradient)."""
    result: frozenset[TaskKey] | None = None
    for applied in applied_sets:
        keys = frozenset(applied)
        result = keys if result is None else result & keys
    return result if result is not None else frozenset()


def params_finite(state: PServerState) -> bool:
    return bool(np.all(np.isfinite(state.optimizer.params)))
