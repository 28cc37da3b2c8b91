"""The coordinator's state machine: epoch and shard progress of a training job (the pservers'
exactly-once ledger is pserver_state.py). Pure: inputs are observations, outputs are
decisions; no I/O, no clock.

Coordinator rule (level-triggered, so a restart only has to reload its last persisted state):
  * every shard of the current epoch is published once;
  * when every pserver has applied every shard of the epoch, the next epoch starts;
  * work can be lost after it was acked, when a pserver restores an older checkpoint. A lost
    shard of an *earlier* epoch is certain (an epoch only ends once all of it was applied) and
    is published again at once. A lost shard of the *current* epoch looks like one in flight
    until the work queue is empty; then it is published again. Duplicates are harmless: the
    pserver applies each (epoch, shard, batch) at most once, and a trainer resumes a shard
    at its first batch not yet applied.
  * the job finishes when the last epoch is complete and no earlier shard is missing.
The caller must read the queue depth *before* the applied sets: a task leaves the queue
only after its gradient was applied, so "empty queue, then not applied" means lost.
Every publish batch takes a new `round`, part of the message id, so the queue's
de-duplication drops a re-publish of the same batch after a crash but never a deliberate one.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any

TaskKey = tuple[int, int]  # (epoch, shard)


# ---------------------------------------------------------------------------------------------
# Coordinator


@dataclass(frozen=True)
class TaskSpec:
    """One unit of work: compute the gradient of ``shard`` for ``epoch``."""

    epoch: int
    shard: int
    round: int  # publish batch; part of the message id so re-publishes are not de-duplicated

    def message_id(self, job: str) -> str:
        return f"{job}.{self.epoch}.{self.shard}.{self.round}"


@dataclass(frozen=True)
class Observation:
    """What the coordinator sees in one tick."""

    queued_tasks: int  # messages in the job's work queue (read first)
    applied: frozenset[TaskKey]  # applied by every pserver, epochs >= the current one
    missing_before: frozenset[TaskKey] = frozenset()  # earlier epochs, not applied somewhere


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
    published: frozenset[int] = frozenset()  # shards of `epoch` published
    applied: frozenset[int] = frozenset()  # shards of `epoch` applied, as last observed
    requeued: frozenset[TaskKey] = frozenset()  # lost earlier-epoch shards published again
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

    @property
    def last_epoch(self) -> bool:
        return self.epochs is not None and self.epoch + 1 >= self.epochs

    def to_json(self) -> dict[str, Any]:
        return {
            "job": self.job,
            "num_shards": self.num_shards,
            "epochs": self.epochs,
            "epoch": self.epoch,
            "round": self.round,
            "published": sorted(self.published),
            "applied": sorted(self.applied),
            "requeued": sorted([e, s] for e, s in self.requeued),
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
                requeued=frozenset((int(e), int(s)) for e, s in data.get("requeued", [])),
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
    is refused because the applied sets would no longer mean the same data. A finished job
    is re-checked on the next step, since its pserver may have lost work meanwhile.
    """
    if persisted is None:
        return new_coordinator(job, num_shards=num_shards, epochs=epochs)
    if persisted.job != job:
        raise ValueError(f"persisted state is for job {persisted.job!r}, not {job!r}")
    if persisted.num_shards != num_shards:
        raise ValueError(
            f"job {job!r} was started with {persisted.num_shards} shards, not {num_shards}"
        )
    return replace(persisted, epochs=epochs, finished=False)


def step(state: CoordinatorState, observation: Observation) -> tuple[CoordinatorState, Decision]:
    """Advance on one observation; returns the new state and what to publish."""
    if state.finished:
        return state, Decision(finished=True)
    missing_before = observation.missing_before
    requeued = state.requeued & missing_before  # requeued and not yet applied
    lost_before = missing_before - requeued
    if observation.queued_tasks == 0:
        lost_before |= requeued  # requeued, yet neither queued nor applied: lost again
    completed: list[int] = []
    while True:
        applied = frozenset(s for (e, s) in observation.applied if e == state.epoch)
        state = replace(state, applied=applied & state.all_shards, requeued=requeued)
        if state.applied != state.all_shards:
            break
        if state.last_epoch:
            if not missing_before:
                completed.append(state.epoch)
                state = replace(state, finished=True, requeued=frozenset())
                return state, Decision(completed_epochs=tuple(completed), finished=True)
            break
        completed.append(state.epoch)
        state = replace(state, epoch=state.epoch + 1, published=frozenset(), applied=frozenset())
    unpublished = state.all_shards - state.published - state.applied
    lost_now: frozenset[int] = frozenset()
    if not unpublished and observation.queued_tasks == 0:
        lost_now = state.all_shards - state.applied  # published, not queued, not applied
    shards = sorted(unpublished | lost_now)
    earlier = sorted(lost_before)
    if not shards and not earlier:
        return state, Decision(completed_epochs=tuple(completed))
    republished = len(lost_now) + len(earlier)
    state = replace(state, round=state.round + 1, republished=state.republished + republished)
    tasks = tuple(TaskSpec(e, s, state.round) for e, s in earlier) + tuple(
        TaskSpec(state.epoch, s, state.round) for s in shards
    )
    return state, Decision(
        publish=tasks, completed_epochs=tuple(completed), republished=republished
    )


def mark_published(state: CoordinatorState, tasks: Iterable[TaskSpec]) -> CoordinatorState:
    """Record tasks the work queue has acknowledged."""
    tasks = tuple(tasks)
    current = frozenset(task.shard for task in tasks if task.epoch == state.epoch)
    earlier = frozenset((task.epoch, task.shard) for task in tasks if task.epoch < state.epoch)
    return replace(state, published=state.published | current, requeued=state.requeued | earlier)


def progress_fraction(state: CoordinatorState) -> float:
    """Share of the whole job done, for progress events (0 when the epoch count is open)."""
    if state.epochs is None:
        return 0.0
    if state.finished:
        return 1.0
    done = state.epoch * state.num_shards + len(state.applied)
    return done / (state.epochs * state.num_shards)


def applied_everywhere(applied_sets: Iterable[Iterable[TaskKey]]) -> frozenset[TaskKey]:
    """(epoch, shard) pairs complete on every pserver (a shard counts once all of the
    model's pieces took all of its batches)."""
    result: frozenset[TaskKey] | None = None
    for applied in applied_sets:
        keys = frozenset(applied)
        result = keys if result is None else result & keys
    return result if result is not None else frozenset()
