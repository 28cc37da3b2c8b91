"""Where the trainer services keep things on the bus: buckets, keys, consumers, subjects.

The pserver's binary request/reply subjects, the work queue depth and checkpoint objects,
named once so coordinator, pserver and trainers agree.
"""

from __future__ import annotations

from typing import Literal

from tideshift.events import SHARD_TASK, TRAINER_CHECKPOINTS_BUCKET
from tideshift.events.subjects import PSERVER_RPC
from tideshift.events.tokens import encode_token
from tideshift.services.common.bus import TRAINING_TASK_STREAM, Bus

PServerOp = Literal["init", "params", "push", "status"]
MEMBER_TTL_SECONDS = 6.0


def pserver_subject(job: str, index: int, op: PServerOp) -> str:
    return PSERVER_RPC.at(job=job, index=str(index), op=op)


def task_durable(job: str) -> str:
    """The pull consumer all trainers of a job share (the work queue's only consumer)."""
    return f"trainers-{encode_token(job)}"


def member_key(job: str, trainer: str) -> str:
    return f"{encode_token(job)}.{encode_token(trainer)}"


def member_prefix(job: str) -> str:
    return f"{encode_token(job)}."


def job_key(job: str, part: Literal["spec", "state", "layout"]) -> str:
    return f"{encode_token(job)}.{part}"


def progress_key(job: str, index: int) -> str:
    """Where pserver `index` records how many batches it applied (jobspec.PServerProgress)."""
    return f"{encode_token(job)}.progress-{index}"


async def queued_tasks(bus: Bus, job: str) -> int:
    """Tasks of `job` stored in the work queue: published and not yet acked."""
    return await bus.queued(SHARD_TASK.at(job=job), stream=TRAINING_TASK_STREAM)


async def load_object(bus: Bus, name: str) -> bytes | None:
    return await bus.get_object(TRAINER_CHECKPOINTS_BUCKET, name)


async def store_object(bus: Bus, name: str, data: bytes) -> None:
    await bus.put_object(TRAINER_CHECKPOINTS_BUCKET, name, data)
