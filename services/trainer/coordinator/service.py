"""`tideshift run coordinator --job NAME --dataset DATA [--epochs E]`: the job's master.

Writes the job spec once (shard locations, optimiser, pserver count), then ticks: reads the
work queue depth and the pservers' finished shards, lets protocol.step decide what to
publish, publishes shard tasks to the JetStream work queue (message ids make a re-publish
after a crash a no-op), persists its state to KV, and reports progress and trainer
crashes on the bus. A lease keeps a second coordinator of the same job passive. With
--epochs it exits 0 once the last epoch is applied, printing a JSON summary (shards, and per
pserver the batches applied, pushes refused as duplicates and batches re-trained after a
restore) as its last stdout line; /metrics shows the same per pserver while it runs.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import sys
from collections.abc import Sequence
from dataclasses import replace
from functools import partial
from typing import Any

from prometheus_client import Gauge
from pydantic import Field, ValidationError

from tideshift.events import (
    JOB_PROGRESS,
    SHARD_TASK,
    TRAINER_JOBS_BUCKET,
    TRAINER_MEMBERS_BUCKET,
    TRAINER_MEMBERSHIP,
    Envelope,
    JobProgress,
    ShardTask,
    TrainerMembership,
)
from tideshift.events.tokens import decode_token, encode_token
from tideshift.services.common.bus import Bus, Lease, RequestFailed, TypedKV, follow
from tideshift.services.common.clock import WALL_CLOCK, Clock, utc_now, wait_for_event
from tideshift.services.common.runtime import ServiceContext, run_service
from tideshift.services.common.settings import ServiceSettings, parse_settings
from tideshift.services.trainer.coordinator.dataset import resolve_shards
from tideshift.services.trainer.core.jobspec import JobSpec, PersistedCoordinator
from tideshift.services.trainer.core.layout import DEFAULT_MAX_PIECE_BYTES
from tideshift.services.trainer.core.optim import OptimizerSpec
from tideshift.services.trainer.core.protocol import (
    CoordinatorState,
    Decision,
    Observation,
    applied_everywhere,
    mark_published,
    resume_coordinator,
    step,
)
from tideshift.services.trainer.port.bus import (
    MEMBER_TTL_SECONDS,
    job_key,
    member_prefix,
    queued_tasks,
)
from tideshift.services.trainer.port.jobs import poll_until, read_generation, read_spec
from tideshift.services.trainer.port.pserver_client import PServerStatus, StatusClient

log = logging.getLogger("tideshift.coordinator")
PROGRESS_EVERY_SECONDS = 2.0
WAIT_LOG_EVERY_SECONDS = 30.0
LEASE_POLL_SECONDS = 1.0
PSERVER_BATCHES = Gauge(
    "tideshift_training_pserver_batches",
    "Per pserver: batches applied (each once), pushes refused as duplicates, batches "
    "re-trained after a restore from an older checkpoint",
    ["job", "pserver", "kind"],
)


def pserver_figures(statuses: list[PServerStatus]) -> dict[str, list[int]]:
    """The summary's per-pserver counts, in pserver order."""
    return {
        "batches_applied": [s.version for s in statuses],
        "duplicates_refused": [s.duplicates for s in statuses],
        "retrained": [s.retrained for s in statuses],
    }


class CoordinatorSettings(ServiceSettings):
    """Coordinator of one elastic training job: shards the data, hands out tasks per epoch."""

    job: str = Field(min_length=1, max_length=253, description="training job name")
    epochs: int | None = Field(
        default=None, gt=0, description="stop after this many epochs; unset = until stopped"
    )
    dataset: str = Field(
        min_length=1,
        description="shard locations: a directory, a glob, a URI or a JSON list of them",
    )
    optimizer: OptimizerSpec = Field(
        default=OptimizerSpec(),
        description='optimiser the pservers apply, JSON: {"kind": "adam", "learning_rate": 0.01}',
    )
    pservers: int = Field(default=1, gt=0, le=256, description="parameter servers")
    max_piece_bytes: int = Field(
        default=DEFAULT_MAX_PIECE_BYTES,
        ge=1024,
        le=4 * 1024 * 1024,
        description="largest array slice per message; keep below the NATS payload limit",
    )
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
        """The spec to publish; raises ValueError when the dataset names no shard."""
        return JobSpec(
            job=self.job,
            shards=resolve_shards(self.dataset),
            optimizer=self.optimizer,
            pservers=self.pservers,
            ack_wait_seconds=self.ack_wait_seconds,
            max_piece_bytes=self.max_piece_bytes,
        )


class Membership:
    """Live trainers from the expiring member keys; a key that vanishes without a `left`
    event is a crash. At most `left_limit` names of trainers that left are kept between two
    refreshes (they come from outside): the oldest go first, except those whose key is live
    (`known`), kept until it vanishes lest a clean leave be reported as a crash."""

    def __init__(self, bus: Bus, job: str, clock: Clock, *, left_limit: int = 4096) -> None:
        self.bus = bus
        self.job = job
        self.clock = clock
        self.left_limit = left_limit
        self.known: set[str] = set()
        self.left: dict[str, None] = {}  # insertion order: the oldest first

    async def listen(self, stopping: asyncio.Event) -> None:
        await follow(
            lambda: self.bus.subscribe(
                TRAINER_MEMBERSHIP.filter(job=self.job), consumer=f"coordinator-{self.job}"
            ),
            self._on_change,
            clock=self.clock,
            stopping=stopping,
            name=f"job {self.job}: membership events",
        )

    def _on_change(self, envelope: Envelope[TrainerMembership]) -> None:
        if envelope.data.change != "left":
            return
        self.left[envelope.data.trainer] = None
        over = len(self.left) - self.left_limit
        if over > 0:  # the oldest whose key is not live go
            for trainer in [t for t in self.left if encode_token(t) not in self.known][:over]:
                del self.left[trainer]

    async def refresh(self, members: TypedKV) -> int:
        """Publish `crashed` for trainers whose key expired; returns the live count."""
        prefix = member_prefix(self.job)
        current = {key[len(prefix) :] for key in await members.keys() if key.startswith(prefix)}
        for token in self.known - current:
            await self._gone(token)
        self.known = current
        # A `left` only matters until its key vanishes; one for a key already gone (the
        # trainer joined and left between two refreshes) would otherwise be kept for ever.
        self.left = {trainer: None for trainer in self.left if encode_token(trainer) in current}
        return len(current)

    async def _gone(self, token: str) -> None:
        try:
            trainer = decode_token(token)
        except ValueError:
            return
        if trainer in self.left:
            del self.left[trainer]
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
                    at=utc_now(self.clock),
                ),
            )


class Coordinator:
    def __init__(
        self, bus: Bus, spec: JobSpec, state: CoordinatorState, jobs: TypedKV, clock: Clock
    ) -> None:
        self.bus = bus
        self.clock = clock
        self.spec = spec
        self.state = state
        self.jobs = jobs
        self.client = StatusClient(bus, spec)
        self.in_flight = 0
        self.applied_total = 0
        self.generation: str | None = None  # of the model the pservers were last seen serving
        self.trainers = 0

    async def persist(self) -> None:
        await self.jobs.put(
            job_key(self.spec.job, "state"), PersistedCoordinator(state=self.state.to_json())
        )

    async def observe(self) -> Observation:
        # Queue depth first, applied sets second: see protocol's module docstring.
        queued = await queued_tasks(self.bus, self.spec.job)
        self._follow(await read_generation(self.bus, self.spec.job))
        statuses = await self.client.status(from_epoch=self.state.epoch)
        if any(s.generation != self.generation for s in statuses):
            raise RequestFailed("a pserver still serves the model from before a reset")
        self.in_flight = queued
        self.applied_total = min(s.version for s in statuses)
        for kind, counts in pserver_figures(statuses).items():
            for index, count in enumerate(counts):
                PSERVER_BATCHES.labels(self.spec.job, str(index), kind).set(count)
        return Observation(
            queued_tasks=queued,
            applied=applied_everywhere(s.applied for s in statuses),
            missing_before=frozenset().union(*(s.missing for s in statuses)),
        )

    def _follow(self, generation: str | None) -> None:
        """Start over at epoch 0 when the job's model was reset (its generation changed),
        in a new round so that the work queue does not drop the tasks as re-publishes."""
        if self.generation is not None and generation != self.generation:
            log.warning("job %s: the job was reset; starting over at epoch 0", self.spec.job)
            fresh = resume_coordinator(
                None, job=self.spec.job, num_shards=self.spec.num_shards, epochs=self.state.epochs
            )
            self.state = replace(fresh, round=self.state.round + 1)
        self.generation = generation

    async def publish(self, decision: Decision) -> None:
        now = utc_now(self.clock)
        for task in decision.publish:
            await self.bus.publish_durable(
                SHARD_TASK.at(job=self.spec.job),
                ShardTask(
                    job=self.spec.job,
                    epoch=task.epoch,
                    shard=task.shard,
                    shards=self.spec.num_shards,
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

    async def report(self) -> None:
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
                    redelivered=self.state.republished,
                    trainers=self.trainers,
                    at=utc_now(self.clock),
                ),
            )

    async def summary(self) -> dict[str, Any]:
        statuses = await self.client.status(from_epoch=self.state.epoch)
        epochs = self.state.epochs or self.state.epoch + 1
        return {
            "job": self.spec.job,
            "epochs": epochs,
            "shards": self.spec.num_shards,
            "watermark": min(s.watermark for s in statuses),
            **pserver_figures(statuses),
            "republished": self.state.republished,
        }


async def _prepare_spec(bus: Bus, settings: CoordinatorSettings) -> tuple[JobSpec, TypedKV]:
    spec = await asyncio.to_thread(settings.job_spec)
    stored = await read_spec(bus, spec.job)
    if stored is not None and not stored.same_training(spec):
        raise ValueError(
            f"job {spec.job} already exists with other shards, optimiser or pservers; "
            "use a new job name or the same settings"
        )
    jobs = await bus.kv(TRAINER_JOBS_BUCKET)
    await jobs.put(job_key(spec.job, "spec"), spec)
    log.info("job %s: %d shards, optimiser %s", spec.job, spec.num_shards, spec.optimizer.kind)
    return spec, jobs


async def _load_state(
    jobs: TypedKV, settings: CoordinatorSettings, num_shards: int
) -> CoordinatorState:
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
        previous, job=settings.job, num_shards=num_shards, epochs=settings.epochs
    )


async def _lead(lease: Lease, clock: Clock, stopping: asyncio.Event, job: str) -> bool:
    """Whether this coordinator took the lease (False: stopped first)."""

    async def held() -> bool | None:
        return await lease.try_acquire() or None

    acquired = await poll_until(
        held,
        clock=clock,
        stopping=stopping,
        every=LEASE_POLL_SECONDS,
        waiting=f"job {job}: another coordinator holds the lease; waiting",
    )
    return bool(acquired)


async def run(
    settings: CoordinatorSettings, context: ServiceContext, *, clock: Clock = WALL_CLOCK
) -> None:
    """The service body; the clock is the wall clock unless a caller passes its own."""
    bus, stopping = context.bus, context.stopping
    lease = await bus.lease(
        f"coordinator.{encode_token(settings.job)}",
        holder=context.instance,
        ttl_seconds=settings.lease_seconds,
    )
    if not await _lead(lease, clock, stopping, settings.job):
        return
    spec, jobs = await _prepare_spec(bus, settings)
    state = await _load_state(jobs, settings, spec.num_shards)
    coordinator = Coordinator(bus, spec, state, jobs, clock)
    membership = Membership(bus, spec.job, clock)
    members = await bus.kv(TRAINER_MEMBERS_BUCKET, ttl_seconds=MEMBER_TTL_SECONDS)
    listener = asyncio.create_task(membership.listen(stopping))
    context.ready.set()
    try:
        await _coordinate(
            coordinator, membership, members, lease, settings=settings, stopping=stopping
        )
    finally:
        listener.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await listener
        await lease.release()


async def _coordinate(
    coordinator: Coordinator,
    membership: Membership,
    members: TypedKV,
    lease: Lease,
    *,
    settings: CoordinatorSettings,
    stopping: asyncio.Event,
) -> None:
    """Tick until the job finishes (its summary printed) or the service stops."""
    clock, job = coordinator.clock, coordinator.spec.job
    last_report = last_wait_log = -math.inf
    while not stopping.is_set():
        try:
            if not await lease.try_acquire():
                log.warning("job %s: lost the coordinator lease; waiting for it", job)
                if not await _lead(lease, clock, stopping, job):
                    return
            # first: a tick fails while pservers are away, and `left` must be pruned even then
            coordinator.trainers = await membership.refresh(members)
            decision = await coordinator.tick()
            if decision.finished:
                await _finish(coordinator)
                return
            if decision.publish or clock.now() - last_report >= PROGRESS_EVERY_SECONDS:
                await coordinator.report()
                last_report = clock.now()
        except RequestFailed as error:
            if clock.now() - last_wait_log >= WAIT_LOG_EVERY_SECONDS:
                log.info("job %s: waiting for pservers: %s", job, error)
                last_wait_log = clock.now()
        except Exception as error:  # NATS hiccup: the next tick re-reads everything
            log.warning("job %s: tick failed: %s", job, error)
        await wait_for_event(clock, stopping, settings.tick_seconds)


async def _finish(coordinator: Coordinator) -> None:
    """Report the finished job and print its summary as the last stdout line."""
    summary = await coordinator.summary()
    await coordinator.report()
    log.info("job %s: finished: %s", coordinator.spec.job, summary)
    print(json.dumps(summary), flush=True)


def main(argv: Sequence[str]) -> int:
    settings = parse_settings(CoordinatorSettings, argv, prog="tideshift run coordinator")
    try:
        settings.job_spec()
    except (ValueError, ValidationError) as error:
        print(f"tideshift run coordinator: invalid --dataset: {error}", file=sys.stderr)
        return 2
    return run_service("coordinator", settings, partial(run, settings))
