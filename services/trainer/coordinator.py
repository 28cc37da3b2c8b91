"""`tideshift run coordinator --job NAME [--epochs E]`: the job's master (EDL's "master").

Writes the job spec and the shard files once, then ticks: reads the work queue depth and
the pservers' applied sets, lets protocol.step decide what to publish, publishes shard tasks
to the JetStream work queue (message ids make a re-publish after a crash a no-op), persists
its state to KV, and reports progress and trainer crashes on the bus. A lease keeps a second
coordinator of the same job passive. With --epochs it exits 0 once the last epoch is
applied, printing a JSON summary as its last stdout line.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import sys
from collections.abc import Sequence
from datetime import UTC, datetime
from functools import partial
from pathlib import Path
from typing import Any

from pydantic import Field, ValidationError

from tideshift.events import (
    JOB_PROGRESS,
    SHARD_TASK,
    TRAINER_MEMBERSHIP,
    JobProgress,
    ShardTask,
    TrainerMembership,
)
from tideshift.events.tokens import decode_token, encode_token
from tideshift.services.common.bus import Bus, Lease, RequestFailed, TypedKV
from tideshift.services.common.runtime import ServiceContext, run_service
from tideshift.services.common.settings import ServiceSettings, parse_settings
from tideshift.services.trainer.busport import (
    JOBS_BUCKET,
    MEMBER_TTL_SECONDS,
    MEMBERS_BUCKET,
    job_key,
    member_prefix,
    queued_tasks,
)
from tideshift.services.trainer.dataset import (
    default_data_dir,
    ensure_dataset,
    holdout_path,
    load_shard,
)
from tideshift.services.trainer.jobs import read_spec, sleep_unless
from tideshift.services.trainer.jobspec import JobSpec, PersistedCoordinator
from tideshift.services.trainer.model import log_loss
from tideshift.services.trainer.protocol import (
    CoordinatorState,
    Decision,
    Observation,
    applied_everywhere,
    mark_published,
    resume_coordinator,
    step,
)
from tideshift.services.trainer.pserver_client import PServerClient

log = logging.getLogger("tideshift.coordinator")
PROGRESS_EVERY_SECONDS = 2.0
WAIT_LOG_EVERY_SECONDS = 30.0


class CoordinatorSettings(ServiceSettings):
    """Coordinator of one elastic training job: shards the data, hands out tasks per epoch."""

    job: str = Field(min_length=1, max_length=253, description="training job name")
    epochs: int | None = Field(
        default=None, gt=0, description="stop after this many epochs; unset = until stopped"
    )
    data_dir: str | None = Field(
        default=None, description="shared shard directory; default: <tmp>/tideshift-data/<job>"
    )
    seed: int = Field(default=7, ge=0, description="seed of the synthetic click log")
    shards: int = Field(default=32, gt=0, description="shards per epoch")
    samples_per_shard: int = Field(default=2000, gt=0, description="impressions per shard")
    holdout_samples: int = Field(default=20000, gt=0, description="held-out impressions")
    field_cardinality: int = Field(default=200, gt=0, description="raw values per field")
    num_buckets: int = Field(default=2048, gt=0, description="hashed feature buckets")
    num_fields: int = Field(default=8, gt=0, description="categorical fields per impression")
    learning_rate: float = Field(default=0.3, gt=0, description="Adagrad step")
    l2: float = Field(default=1e-4, ge=0, description="L2 penalty on weights")
    pservers: int = Field(default=1, gt=0, description="parameter servers (key ranges)")
    ack_wait_seconds: float = Field(
        default=10.0, gt=0, description="seconds before an unacked task is redelivered"
    )
    tick_seconds: float = Field(default=0.5, gt=0, description="seconds between progress checks")
    lease_seconds: float = Field(
        default=5.0,
        gt=0,
        description="leadership lease; a crashed coordinator's successor waits this long",
    )

    def job_spec(self) -> JobSpec:
        return JobSpec(
            job=self.job,
            seed=self.seed,
            shards=self.shards,
            samples_per_shard=self.samples_per_shard,
            holdout_samples=self.holdout_samples,
            field_cardinality=self.field_cardinality,
            num_buckets=self.num_buckets,
            num_fields=self.num_fields,
            learning_rate=self.learning_rate,
            l2=self.l2,
            pservers=self.pservers,
            ack_wait_seconds=self.ack_wait_seconds,
            data_dir=self.data_dir or default_data_dir(self.job),
        )


class Membership:
    """Live trainers from the expiring member keys; a key that vanishes without a `left`
    event is a crash."""

    def __init__(self, bus: Bus, job: str) -> None:
        self.bus = bus
        self.job = job
        self.known: set[str] = set()
        self.left: set[str] = set()

    async def listen(self) -> None:
        async for envelope in self.bus.subscribe(
            TRAINER_MEMBERSHIP.filter(job=self.job), consumer=f"coordinator-{self.job}"
        ):
            if envelope.data.change == "left":
                self.left.add(envelope.data.trainer)

    async def refresh(self, members: TypedKV) -> int:
        """Publish `crashed` for trainers whose key expired; returns the live count."""
        prefix = member_prefix(self.job)
        current = {key[len(prefix) :] for key in await members.keys() if key.startswith(prefix)}
        for token in self.known - current:
            await self._gone(token)
        self.known = current
        return len(current)

    async def _gone(self, token: str) -> None:
        try:
            trainer = decode_token(token)
        except ValueError:
            return
        if trainer in self.left:
            self.left.discard(trainer)
            return
        log.warning("job %s: trainer %s stopped heartbeating: crashed", self.job, trainer)
        with contextlib.suppress(Exception):
            await self.bus.publish(
                TRAINER_MEMBERSHIP.at(job=self.job, trainer=trainer),
                TrainerMembership(
                    job=self.job,
                    trainer=trainer,
                    change="crashed",
                    reason=f"no heartbeat for {MEMBER_TTL_SECONDS:.0f}s",
                    at=datetime.now(UTC),
                ),
            )


class Coordinator:
    def __init__(self, bus: Bus, spec: JobSpec, state: CoordinatorState, jobs: TypedKV) -> None:
        self.bus = bus
        self.spec = spec
        self.state = state
        self.jobs = jobs
        self.client = PServerClient(bus, spec)
        self.in_flight = 0
        self.redelivered = 0
        self.applied_total = 0
        self.trainers = 0

    async def persist(self) -> None:
        await self.jobs.put(
            job_key(self.spec.job, "state"), PersistedCoordinator(state=self.state.to_json())
        )

    async def observe(self) -> Observation:
        # Queue depth first, applied sets second: see protocol's module docstring.
        queued = await queued_tasks(self.bus, self.spec.job)
        statuses = await self.client.status(from_epoch=self.state.epoch)
        self.in_flight = queued
        self.redelivered = max(s.redelivered for s in statuses) + self.state.republished
        self.applied_total = min(s.applied_total for s in statuses)
        return Observation(
            queued_tasks=queued,
            applied=applied_everywhere(s.applied for s in statuses),
            missing_before=frozenset().union(*(s.missing for s in statuses)),
        )

    async def publish(self, decision: Decision) -> None:
        now = datetime.now(UTC)
        for task in decision.publish:
            await self.bus.publish_durable(
                SHARD_TASK.at(job=self.spec.job),
                ShardTask(
                    job=self.spec.job,
                    epoch=task.epoch,
                    shard=task.shard,
                    shards=self.spec.shards,
                    issued_at=now,
                ),
                msg_id=task.message_id(self.spec.job),
            )
        self.state = mark_published(self.state, decision.publish)

    async def tick(self) -> Decision:
        observation = await self.observe()
        self.state, decision = step(self.state, observation)
        for epoch in decision.completed_epochs:
            log.info("job %s: epoch %d applied on every pserver", self.spec.job, epoch)
        if decision.republished:
            log.warning(
                "job %s: %d shards were lost (a pserver restored an older "
                "checkpoint); publishing them again",
                self.spec.job,
                decision.republished,
            )
        await self.publish(decision)
        await self.persist()
        return decision

    async def report(self, *, logloss: float | None = None) -> None:
        state = self.state
        with contextlib.suppress(Exception):
            await self.bus.publish(
                JOB_PROGRESS.at(job=self.spec.job),
                JobProgress(
                    job=self.spec.job,
                    state="finished" if state.finished else "running",
                    epoch=state.epoch,
                    epochs=state.epochs,
                    shards=state.num_shards,
                    applied_in_epoch=len(state.applied),
                    applied_total=self.applied_total,
                    in_flight=self.in_flight,
                    redelivered=self.redelivered,
                    trainers=self.trainers,
                    logloss=logloss,
                    at=datetime.now(UTC),
                ),
            )

    async def summary(self) -> dict[str, Any]:
        statuses = await self.client.status(from_epoch=0)
        epochs = self.state.epochs or self.state.epoch + 1
        applied = {
            key for key in applied_everywhere(s.applied for s in statuses) if key[0] < epochs
        }
        params = await self.client.pull()
        holdout = await asyncio.to_thread(
            load_shard, holdout_path(self.spec.data_dir), self.spec.dataset
        )
        return {
            "job": self.spec.job,
            "epochs": epochs,
            "shards": self.spec.shards,
            "applied": len(applied),
            "redelivered": max(s.redelivered for s in statuses) + self.state.republished,
            "logloss": round(log_loss(params, holdout), 6),
        }


async def _prepare_spec(bus: Bus, settings: CoordinatorSettings) -> tuple[JobSpec, TypedKV]:
    spec = settings.job_spec()
    stored = await read_spec(bus, spec.job)
    if stored is not None and not stored.same_training(spec):
        raise ValueError(
            f"job {spec.job} already exists with another model or dataset "
            f"({stored.model_dump(exclude={'data_dir', 'ack_wait_seconds'})}); "
            "use a new job name or the same settings"
        )
    written = await asyncio.to_thread(ensure_dataset, spec.dataset, spec.data_dir)
    if written:
        log.info("job %s: wrote %d data files to %s", spec.job, written, spec.data_dir)
    jobs = await bus.kv(JOBS_BUCKET)
    await jobs.put(job_key(spec.job, "spec"), spec)
    return spec, jobs


async def _load_state(jobs: TypedKV, settings: CoordinatorSettings) -> CoordinatorState:
    try:
        persisted = await jobs.get(job_key(settings.job, "state"), PersistedCoordinator)
        previous = None if persisted is None else CoordinatorState.from_json(persisted.state)
    except (ValidationError, ValueError) as error:
        raise ValueError(
            f"job {settings.job}: persisted coordinator state unusable: {error}"
        ) from error
    if previous is not None:
        log.info(
            "job %s: resuming at epoch %d (%d shards published, %d applied)",
            settings.job,
            previous.epoch,
            len(previous.published),
            len(previous.applied),
        )
    return resume_coordinator(
        previous, job=settings.job, num_shards=settings.shards, epochs=settings.epochs
    )


async def _lead(lease: Lease, stopping: asyncio.Event, job: str) -> bool:
    announced = False
    while not stopping.is_set():
        if await lease.try_acquire():
            return True
        if not announced:
            log.info("job %s: another coordinator holds the lease; waiting", job)
            announced = True
        if await sleep_unless(stopping, 1.0):
            break
    return False


async def run(settings: CoordinatorSettings, context: ServiceContext) -> None:
    bus, stopping = context.bus, context.stopping
    lease = await bus.lease(
        f"coordinator.{encode_token(settings.job)}",
        holder=context.instance,
        ttl_seconds=settings.lease_seconds,
    )
    if not await _lead(lease, stopping, settings.job):
        return
    spec, jobs = await _prepare_spec(bus, settings)
    coordinator = Coordinator(bus, spec, await _load_state(jobs, settings), jobs)
    membership = Membership(bus, spec.job)
    members = await bus.kv(MEMBERS_BUCKET, ttl_seconds=MEMBER_TTL_SECONDS)
    listener = asyncio.create_task(membership.listen())
    context.ready.set()
    loop = asyncio.get_running_loop()
    last_report = 0.0
    last_wait_log = -WAIT_LOG_EVERY_SECONDS
    try:
        while not stopping.is_set():
            try:
                if not await lease.try_acquire():
                    log.warning("job %s: lost the coordinator lease; waiting for it", spec.job)
                    if not await _lead(lease, stopping, spec.job):
                        break
                decision = await coordinator.tick()
                coordinator.trainers = await membership.refresh(members)
                if decision.finished:
                    summary = await coordinator.summary()
                    await coordinator.report(logloss=summary["logloss"])
                    log.info("job %s: finished: %s", spec.job, summary)
                    print(json.dumps(summary), flush=True)
                    return
                if decision.publish or loop.time() - last_report >= PROGRESS_EVERY_SECONDS:
                    await coordinator.report()
                    last_report = loop.time()
            except RequestFailed as error:
                if loop.time() - last_wait_log >= WAIT_LOG_EVERY_SECONDS:
                    log.info("job %s: waiting for pservers: %s", spec.job, error)
                    last_wait_log = loop.time()
            except Exception as error:  # NATS hiccup: the next tick re-reads everything
                log.warning("job %s: tick failed: %s", spec.job, error)
            await sleep_unless(stopping, settings.tick_seconds)
    finally:
        listener.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await listener
        await lease.release()


def main(argv: Sequence[str]) -> int:
    settings = parse_settings(CoordinatorSettings, argv, prog="tideshift run coordinator")
    if settings.data_dir is not None and Path(settings.data_dir).is_file():
        print(
            f"tideshift run coordinator: invalid --data-dir: {settings.data_dir} is a file",
            file=sys.stderr,
        )
        return 2
    return run_service("coordinator", settings, partial(run, settings))
