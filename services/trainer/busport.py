"""What the trainer services need from the bus beyond its typed helpers, in one place.

The pserver's subjects (binary request/reply, not CloudEvents), the work queue depth, the
object store and request errors. Nothing here imports nats; the few calls that reach through
`Bus.js` or the object store wait for bus helpers requested in /work/notes/bus-requests.md,
and only this file has to change when they land.
"""

from __future__ import annotations

import asyncio
from typing import Literal

from events import SHARD_TASK
from events.tokens import encode_token
from services.common.bus import TRAINING_TASK_STREAM, Bus

PServerOp = Literal["params", "push", "status"]
JOBS_BUCKET = "tideshift_trainer_jobs"  # job spec and coordinator state per job
MEMBERS_BUCKET = "tideshift_trainer_members"  # one key per live trainer, expiring
CHECKPOINT_BUCKET = "tideshift_trainer_checkpoints"
MEMBER_TTL_SECONDS = 6.0


class RequestFailed(RuntimeError):
    """A request got no usable answer (timeout, no responder, disconnected)."""


def pserver_subject(job: str, index: int, op: PServerOp) -> str:
    return f"tideshift.v1.training.pserver.{encode_token(job)}.{index}.{op}"


def task_durable(job: str) -> str:
    """The pull consumer all trainers of a job share (the work queue's only consumer)."""
    return f"trainers-{encode_token(job)}"


def member_key(job: str, trainer: str) -> str:
    return f"{encode_token(job)}.{encode_token(trainer)}"


def member_prefix(job: str) -> str:
    return f"{encode_token(job)}."


def job_key(job: str, part: Literal["spec", "state"]) -> str:
    return f"{encode_token(job)}.{part}"


async def request(bus: Bus, subject: str, payload: bytes, *, timeout: float) -> bytes:
    try:
        return await bus.request(subject, payload, timeout=timeout)
    except asyncio.CancelledError:
        raise
    except Exception as error:  # nats timeout / no responders / connection errors
        raise RequestFailed(f"{subject}: {type(error).__name__}: {error}") from error


async def queued_tasks(bus: Bus, job: str) -> int:
    """Tasks of `job` stored in the work queue: published and not yet acked."""
    subject = SHARD_TASK.at(job=job).value
    info = await bus.js.stream_info(TRAINING_TASK_STREAM.name, subjects_filter=subject)
    subjects = info.state.subjects or {}
    return int(subjects.get(subject, 0))


async def load_object(bus: Bus, name: str) -> bytes | None:
    store = await bus.object_store(CHECKPOINT_BUCKET)
    try:
        result = await store.get(name)
    except Exception as error:
        if type(error).__name__ in {"ObjectNotFoundError", "ObjectDeletedError"}:
            return None
        raise
    data = result.data
    return bytes(data) if data is not None else None


async def store_object(bus: Bus, name: str, data: bytes) -> None:
    store = await bus.object_store(CHECKPOINT_BUCKET)
    await store.put(name, data)
