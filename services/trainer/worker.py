"""`tideshift run trainer --job NAME`: an elastic trainer; holds nothing durable.

Loop: pull one task from the job's work queue, pull parameters from the pservers, compute the
shard's gradient, push it, then ack. A long shard heartbeats with `in_progress` so the queue
does not redeliver it. On SIGTERM the trainer stops pulling, finishes its shard if it can
within `--grace-seconds` or naks it (another trainer takes it at once), and exits 0. Killed
outright it never acks, and the queue redelivers the shard after the job's ack wait.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from datetime import UTC, datetime
from enum import Enum
from functools import partial
from pathlib import Path
from typing import Literal, TypeVar

from prometheus_client import Counter
from pydantic import Field
from tenacity import RetryCallState

from tideshift.events import SHARD_TASK, TRAINER_MEMBERSHIP, ShardTask, TrainerMembership
from tideshift.services.common.bus import TRAINING_TASK_STREAM, Bus, Delivery, RequestFailed
from tideshift.services.common.retry import Stopped, exponential, retrying_async
from tideshift.services.common.runtime import ServiceContext, run_service
from tideshift.services.common.settings import ServiceSettings, parse_settings
from tideshift.services.trainer.busport import (
    MEMBER_TTL_SECONDS,
    MEMBERS_BUCKET,
    member_key,
    task_durable,
)
from tideshift.services.trainer.dataset import load_shard, shard_path
from tideshift.services.trainer.jobs import sleep_unless, wait_for_spec
from tideshift.services.trainer.jobspec import JobSpec, MemberBeat
from tideshift.services.trainer.model import InvalidShard, ShardData, compute_gradient
from tideshift.services.trainer.pserver_client import PServerClient

log = logging.getLogger("tideshift.trainer")
R = TypeVar("R")

TASKS = Counter("tideshift_trainer_tasks_total", "Tasks handled by outcome", ["outcome"])
SAMPLES = Counter("tideshift_trainer_samples_total", "Samples whose gradient was applied")
RETRY_DELAY_SECONDS = 1.0
# While a pserver restarts the trainer keeps its task (heartbeating) and retries, instead of
# bouncing the task through the queue; the backoff is capped so it resumes promptly.
PSERVER_RETRY = exponential(initial=0.1, maximum=1.0)


class TrainerSettings(ServiceSettings):
    """Elastic trainer of one training job: pulls shard tasks, pushes gradients."""

    job: str = Field(min_length=1, max_length=253, description="training job name")
    data_dir: str | None = Field(
        default=None, description="shard directory; default: the one in the job spec"
    )
    grace_seconds: float = Field(
        default=10.0,
        gt=0,
        le=18,
        description="on SIGTERM, finish the current shard within this many seconds or nak it",
    )
    request_timeout_seconds: float = Field(
        default=5.0, gt=0, description="timeout of one pserver request"
    )
    min_task_seconds: float = Field(
        default=0.0,
        ge=0,
        description="hold each task at least this long (emulates a heavier model in tests, demos)",
    )


class Verdict(Enum):
    ACK = "ack"  # applied (or already applied): done
    RETRY = "retry"  # pserver unreachable or refused: nak for a prompt redelivery
    POISON = "poison"  # the task itself is wrong: terminate it


class Trainer:
    def __init__(self, bus: Bus, spec: JobSpec, settings: TrainerSettings, name: str) -> None:
        self.bus = bus
        self.spec = spec
        self.settings = settings
        self.name = name
        self.data_dir = Path(settings.data_dir or spec.data_dir)
        self.client = PServerClient(bus, spec, timeout=settings.request_timeout_seconds)
        self.shards: dict[int, ShardData] = {}
        self.heartbeat_seconds = max(0.2, spec.ack_wait_seconds / 3)

    def check_task(self, task: ShardTask) -> str | None:
        """Why this task cannot be for us, or None."""
        if task.job != self.spec.job:
            return f"unknown job {task.job!r}: this trainer serves {self.spec.job!r}"
        if task.shards != self.spec.shards:
            return f"task says {task.shards} shards per epoch, the job has {self.spec.shards}"
        return None

    async def shard(self, index: int) -> ShardData:
        if index not in self.shards:
            path = shard_path(self.data_dir, index)
            self.shards[index] = await asyncio.to_thread(load_shard, path, self.spec.dataset)
        return self.shards[index]

    async def _retrying(
        self, attempt: Callable[[], Awaitable[R]], what: str, stopping: asyncio.Event
    ) -> R | None:
        """`attempt()` until it succeeds, or None once stopping."""

        def announce_first(state: RetryCallState) -> None:
            if state.attempt_number == 1 and state.outcome is not None:
                error = state.outcome.exception()
                log.warning("job %s: %s failed, retrying: %s", self.spec.job, what, error)

        retrying = retrying_async(
            PSERVER_RETRY, stopping=stopping, retry_on=RequestFailed, before_sleep=announce_first
        )
        try:
            return await retrying(attempt)
        except Stopped:
            return None

    async def compute_and_push(
        self, task: ShardTask, delivery: int, stopping: asyncio.Event
    ) -> Verdict:
        started = asyncio.get_running_loop().time()
        try:
            shard = await self.shard(task.shard)
        except InvalidShard as error:
            log.error("job %s: cannot read shard %d: %s", self.spec.job, task.shard, error)
            return Verdict.RETRY
        params = await self._retrying(self.client.pull, "parameter pull", stopping)
        if params is None:
            return Verdict.RETRY
        gradient = await asyncio.to_thread(compute_gradient, params, shard, l2=self.spec.l2)
        elapsed = asyncio.get_running_loop().time() - started
        if elapsed < self.settings.min_task_seconds:
            await asyncio.sleep(self.settings.min_task_seconds - elapsed)
        replies = await self._retrying(
            partial(
                self.client.push,
                epoch=task.epoch,
                shard=task.shard,
                delivery=delivery,
                gradient=gradient,
                trainer=self.name,
            ),
            "gradient push",
            stopping,
        )
        if replies is None:
            return Verdict.RETRY
        rejected = [reply for reply in replies if reply.outcome not in {"applied", "duplicate"}]
        if rejected:
            for reply in rejected:
                log.error(
                    "job %s: pserver %d rejected epoch %d shard %d: %s",
                    self.spec.job,
                    reply.index,
                    task.epoch,
                    task.shard,
                    reply.reason,
                )
            return Verdict.RETRY
        if any(reply.outcome == "applied" for reply in replies):
            SAMPLES.inc(shard.num_samples)
        return Verdict.ACK

    async def keep_alive(self, delivery: Delivery[ShardTask]) -> None:
        while True:
            await asyncio.sleep(self.heartbeat_seconds)
            try:
                await delivery.in_progress()
            except Exception as error:  # a missed heartbeat only risks a redelivery
                log.warning("job %s: in_progress heartbeat failed: %s", self.spec.job, error)

    async def handle(self, delivery: Delivery[ShardTask], stopping: asyncio.Event) -> None:
        task = delivery.event.data
        if (reason := self.check_task(task)) is not None:
            log.error("job %s: terminating a malformed task: %s", self.spec.job, reason)
            TASKS.labels("poison").inc()
            await delivery.term()
            return
        log.info(
            "job %s: computing epoch %d shard %d (delivery %d)",
            self.spec.job,
            task.epoch,
            task.shard,
            delivery.num_delivered,
        )
        work = asyncio.create_task(self.compute_and_push(task, delivery.num_delivered, stopping))
        heartbeat = asyncio.create_task(self.keep_alive(delivery))
        stop_wait = asyncio.create_task(stopping.wait())
        try:
            await asyncio.wait({work, stop_wait}, return_when=asyncio.FIRST_COMPLETED)
            if not work.done():
                log.info(
                    "job %s: stopping; finishing epoch %d shard %d within %.0fs",
                    self.spec.job,
                    task.epoch,
                    task.shard,
                    self.settings.grace_seconds,
                )
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(asyncio.shield(work), self.settings.grace_seconds)
            if not work.done():
                work.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await work
                TASKS.labels("nak").inc()
                await delivery.nak()
                return
            verdict = work.result()
        finally:
            heartbeat.cancel()
            stop_wait.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await heartbeat
        TASKS.labels(verdict.value).inc()
        if verdict is Verdict.ACK:
            await delivery.ack()
        elif verdict is Verdict.RETRY:
            await delivery.nak(None if stopping.is_set() else RETRY_DELAY_SECONDS)
        else:
            await delivery.term()


async def _announce(
    bus: Bus, job: str, trainer: str, change: Literal["joined", "left"], reason: str
) -> None:
    try:
        await bus.publish(
            TRAINER_MEMBERSHIP.at(job=job, trainer=trainer),
            TrainerMembership(
                job=job,
                trainer=trainer,
                change=change,
                reason=reason,
                at=datetime.now(UTC),
            ),
        )
    except Exception as error:  # membership is telemetry; the work goes on
        log.warning("job %s: could not announce %s: %s", job, change, error)


async def _beat(bus: Bus, job: str, trainer: str, stopping: asyncio.Event) -> None:
    """Keep this trainer's member key alive; the coordinator reads a vanished key as a crash."""
    members = await bus.kv(MEMBERS_BUCKET, ttl_seconds=MEMBER_TTL_SECONDS)
    key = member_key(job, trainer)
    while True:
        try:
            await members.put(key, MemberBeat(job=job, trainer=trainer, at=datetime.now(UTC)))
        except Exception as error:
            log.warning("job %s: member heartbeat failed: %s", job, error)
        if await sleep_unless(stopping, MEMBER_TTL_SECONDS / 3):
            return


async def _next(
    deliveries: AsyncIterator[Delivery[ShardTask]], stopping: asyncio.Event
) -> Delivery[ShardTask] | None:
    """The next task, or None once stopping (a pull in progress is abandoned)."""
    pull = asyncio.ensure_future(anext(deliveries))
    stop_wait = asyncio.ensure_future(stopping.wait())
    await asyncio.wait({pull, stop_wait}, return_when=asyncio.FIRST_COMPLETED)
    stop_wait.cancel()
    if pull.done():
        return pull.result()
    pull.cancel()
    try:
        late = await pull
    except (asyncio.CancelledError, StopAsyncIteration):
        return None
    await late.nak()  # the pull won the race with the cancel: hand the task straight back
    return None


async def run(settings: TrainerSettings, context: ServiceContext) -> None:
    bus, stopping, name = context.bus, context.stopping, context.instance
    spec = await wait_for_spec(bus, settings.job, stopping)
    if spec is None:
        return
    trainer = Trainer(bus, spec, settings, name)
    beat = asyncio.create_task(_beat(bus, spec.job, name, stopping))
    await _announce(bus, spec.job, name, "joined", "")
    deliveries = bus.consume(
        SHARD_TASK.at(job=spec.job),
        stream=TRAINING_TASK_STREAM,
        durable=task_durable(spec.job),
        ack_wait_seconds=spec.ack_wait_seconds,
        max_deliver=-1,
        max_ack_pending=1024,
        batch=1,
        fetch_timeout=1.0,
    )
    context.ready.set()
    log.info("job %s: trainer %s joined", spec.job, name)
    try:
        while not stopping.is_set():
            delivery = await _next(deliveries, stopping)
            if delivery is None:
                break
            if stopping.is_set():
                await delivery.nak()
                break
            try:
                await trainer.handle(delivery, stopping)
            except Exception as error:  # one task's failure must not stop the trainer
                TASKS.labels("error").inc()
                log.exception("job %s: task failed: %s", spec.job, error)
    finally:
        with contextlib.suppress(Exception):
            await deliveries.aclose()  # type: ignore[attr-defined]
        await _announce(bus, spec.job, name, "left", "stopped (SIGTERM or SIGINT)")
        stopping.set()
        await beat
        members = await bus.kv(MEMBERS_BUCKET, ttl_seconds=MEMBER_TTL_SECONDS)
        await members.delete(member_key(spec.job, name))
        log.info("job %s: trainer %s left", spec.job, name)


def main(argv: Sequence[str]) -> int:
    settings = parse_settings(TrainerSettings, argv, prog="tideshift run trainer")
    return run_service("trainer", settings, partial(run, settings))
