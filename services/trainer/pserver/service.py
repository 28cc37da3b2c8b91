"""`tideshift run pserver --job NAME [--index I]`: one share of a job's parameters.

Waits for the job's spec and for the first trainer to publish the model's layout, then for
the lease of (job, index): a second pserver with the same index is a hot standby that takes
over when the holder stops renewing. The leader serves initial values, parameter pulls,
chunked gradient pushes and status over NATS request/reply, applies each (epoch, shard,
batch) exactly once (core/pserver_state.py), and checkpoints pieces, optimiser slots and ledger
together to the JetStream object store every few seconds, after initialisation and on
SIGTERM. A restart loses at most the batches since the last checkpoint; the ledger forgets
them too, so trainers resume there and the coordinator re-publishes finished shards it lost.
How many batches it had applied is recorded in KV as they are applied (one round trip
behind), so the successor counts the lost ones it applies again as re-trained.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import OrderedDict
from collections.abc import Sequence
from functools import partial
from typing import Literal

import numpy as np
from prometheus_client import Counter, Gauge
from pydantic import Field

from tideshift.events import TRAINER_JOBS_BUCKET
from tideshift.events.tokens import encode_token
from tideshift.services.common.bus import Bus, Lease
from tideshift.services.common.clock import WALL_CLOCK, Clock, wait_for_event
from tideshift.services.common.runtime import ServiceContext, run_service
from tideshift.services.common.settings import ServiceSettings, parse_settings
from tideshift.services.trainer.core.checkpoint import encode_checkpoint
from tideshift.services.trainer.core.jobspec import JobSpec, PServerProgress
from tideshift.services.trainer.core.messages import pack_pieces, unpack_pieces, unpack_push_part
from tideshift.services.trainer.core.pserver_state import (
    MAX_OPEN_EPOCHS,
    GradientPush,
    PieceUpdate,
    PServerState,
    PushOutcome,
    PushResult,
)
from tideshift.services.trainer.core.wire import WireError, header_int, header_str, pack, unpack
from tideshift.services.trainer.port.bus import (
    PServerOp,
    progress_key,
    pserver_subject,
    store_object,
)
from tideshift.services.trainer.port.jobs import (
    poll_until,
    read_generation,
    wait_for_layout,
    wait_for_spec,
)
from tideshift.services.trainer.pserver.store import checkpoint_name, forget, restore

log = logging.getLogger("tideshift.pserver")

PUSHES = Counter("tideshift_pserver_pushes_total", "Gradient pushes by outcome", ["outcome"])
VERSION = Gauge("tideshift_pserver_version", "Batches applied so far")
CHECKPOINTS = Counter("tideshift_pserver_checkpoints_total", "Checkpoints written")
RETRAINED = Counter(
    "tideshift_pserver_retrained_total",
    "Batches applied again after a restore from a checkpoint older than what was applied",
)
REFUSED = Counter(
    "tideshift_pserver_requests_refused_total",
    "Requests answered with an error: malformed, another job's, out of range, or not served yet",
    ["op"],
)
MAX_PENDING_PUSHES = 64  # pushes with parts still missing; the oldest is dropped beyond


class PServerSettings(ServiceSettings):
    """Parameter server of one elastic training job (one share of its model's pieces)."""

    job: str = Field(min_length=1, max_length=253, description="training job name")
    index: int = Field(default=0, ge=0, description="which share this pserver owns (0-based)")
    checkpoint_seconds: float = Field(
        default=5.0, gt=0, description="seconds between checkpoints while gradients arrive"
    )
    lease_seconds: float = Field(
        default=5.0,
        gt=0,
        description="lease of (job, index); a standby takes over this long after a crash",
    )


def refuse(op: PServerOp, reason: str) -> bytes:
    """The error reply to a request on `op`, counted and logged."""
    REFUSED.labels(op).inc()
    log.warning("refused a %s request: %s", op, reason)
    return pack({"error": reason})


def lease_name(job: str, index: int) -> str:
    return f"pserver.{encode_token(job)}.{index}"


class ParameterServer:
    def __init__(self, bus: Bus, spec: JobSpec, state: PServerState, generation: str) -> None:
        self.bus = bus
        self.spec = spec
        self.state = state
        self.generation = generation  # of the model it serves (StoredLayout.generation)
        self.accepting = True
        self.checkpointed_version = -1
        self.pending_init: dict[int, np.ndarray] = {}
        self.pending_pushes: OrderedDict[str, dict[int, tuple[PieceUpdate, ...]]] = OrderedDict()
        self.progressed = asyncio.Event()  # a batch was applied since the last progress record

    @property
    def index(self) -> int:
        return self.state.index

    def _check_job(self, header: dict[str, object]) -> str | None:
        if not self.accepting:
            return "pserver is stopping; retry shortly"
        job = header_str(header, "job")
        if job != self.spec.job:
            return f"unknown job {job!r}: this pserver serves {self.spec.job!r}"
        return None

    async def on_init(self, raw: bytes) -> bytes:
        """Initial values of some owned pieces; the first complete set wins."""
        try:
            header, values = unpack_pieces(raw)
            if (refusal := self._check_job(header)) is not None:
                return refuse("init", refusal)
        except WireError as error:
            return refuse("init", f"malformed init: {error}")
        if not self.state.initialised:
            owned = {piece.id for piece in self.state.owned()}
            self.pending_init.update({k: v.copy() for k, v in values.items() if k in owned})
            if owned <= set(self.pending_init):
                try:
                    self.state.initialise(self.pending_init)
                except ValueError as error:
                    self.pending_init.clear()
                    return refuse("init", f"bad initial values: {error}")
                self.pending_init.clear()
                await self.checkpoint()  # initial values must survive a restart
                log.info("job %s: pserver %d initialised", self.spec.job, self.index)
        return pack({"initialised": self.state.initialised})

    async def on_params(self, raw: bytes) -> bytes:
        try:
            header, _ = unpack(raw)
            if (refusal := self._check_job(header)) is not None:
                return refuse("params", refusal)
            wanted = header.get("pieces")
            if not isinstance(wanted, list) or not all(isinstance(i, int) for i in wanted):
                raise WireError("field 'pieces': expected a list of piece ids")
        except WireError as error:
            return refuse("params", f"malformed params request: {error}")
        if not self.state.initialised:
            return refuse("params", "not initialised yet")
        missing = [i for i in wanted if i not in self.state.pieces]
        if missing:
            return refuse("params", f"pieces {missing[:5]} are not held by pserver {self.index}")
        values = {i: self.state.pieces[i].params for i in wanted}
        return pack_pieces({"version": self.state.ledger.applied_batches}, values)

    def _assemble(self, raw: bytes) -> GradientPush | PushResult | None:
        """The whole push once its last part arrived; a rejection; or None (parts missing)."""
        try:
            part = unpack_push_part(raw)
        except WireError as error:
            return PushResult(PushOutcome.REJECTED, f"malformed gradient push: {error}")
        if part.job != self.spec.job:
            return PushResult(PushOutcome.REJECTED, f"unknown job {part.job!r}")
        if part.parts == 1:
            received = {0: part.updates}
        else:
            received = self.pending_pushes.setdefault(part.push_id, {})
            received[part.part] = part.updates
            if len(self.pending_pushes) > MAX_PENDING_PUSHES:
                self.pending_pushes.popitem(last=False)
            if len(received) < part.parts:
                return None
            del self.pending_pushes[part.push_id]
        updates = tuple(u for index in sorted(received) for u in received[index])
        return GradientPush(part.epoch, part.shard, part.batch, part.last, updates)

    async def on_push(self, raw: bytes) -> bytes:
        if not self.accepting:
            return refuse("push", "pserver is stopping; retry shortly")
        assembled = self._assemble(raw)
        if assembled is None:
            return pack({"outcome": "partial"})
        # No await between reading and changing the state: pushes apply atomically.
        retrained = self.state.ledger.retrained
        result = assembled if isinstance(assembled, PushResult) else self.state.push(assembled)
        PUSHES.labels(result.outcome.value).inc()
        RETRAINED.inc(self.state.ledger.retrained - retrained)
        VERSION.set(self.state.ledger.applied_batches)
        if result.outcome is PushOutcome.APPLIED:
            self.progressed.set()
        if result.outcome is PushOutcome.REJECTED:
            REFUSED.labels("push").inc()
            log.warning("job %s: rejected a gradient push: %s", self.spec.job, result.reason)
        return pack(
            {
                "outcome": result.outcome.value,
                "reason": result.reason,
                "next_batch": result.next_batch,
                "version": self.state.ledger.applied_batches,
            }
        )

    async def on_status(self, raw: bytes) -> bytes:
        """Finished pairs of open epochs >= `from_epoch`, unfinished pairs of open epochs
        below it, and optionally one shard's position. Bounded: a `from_epoch` beyond the
        open epochs or a wrong shard count is refused, never iterated."""
        try:
            header, _ = unpack(raw)
            if (refusal := self._check_job(header)) is not None:
                return refuse("status", refusal)
            from_epoch = header_int(header, "from_epoch", minimum=0)
            shards = header_int(header, "shards", minimum=1)
        except WireError as error:
            return refuse("status", f"malformed status request: {error}")
        ledger = self.state.ledger
        if shards != ledger.num_shards:
            return refuse("status", f"shards {shards}: the job has {ledger.num_shards}")
        if from_epoch > ledger.watermark + MAX_OPEN_EPOCHS:
            return refuse(
                "status",
                f"from_epoch {from_epoch} is beyond the open epochs "
                f"[{ledger.watermark}, {ledger.watermark + MAX_OPEN_EPOCHS}]",
            )
        reply: dict[str, object] = {
            "index": self.index,
            "initialised": self.state.initialised,
            "version": ledger.applied_batches,
            "duplicates": ledger.duplicates,
            "retrained": ledger.retrained,
            "watermark": ledger.watermark,
            "generation": self.generation,
        }
        if "epoch" in header and "shard" in header:
            try:
                epoch, shard = header_int(header, "epoch", minimum=0), header_int(header, "shard")
            except WireError as error:
                return refuse("status", f"malformed status request: {error}")
            reply["next_batch"], reply["finished"] = ledger.position(epoch, shard)
        applied = ledger.finished_from(from_epoch)
        missing = ledger.missing_before(from_epoch)
        return pack(
            reply,
            {
                "applied": np.array(applied, dtype=np.int64).reshape(len(applied), 2),
                "missing": np.array(missing, dtype=np.int64).reshape(len(missing), 2),
            },
        )

    async def record_progress(self) -> None:
        """Keep the KV's count of batches applied here one round trip behind the pushes
        (never lowered: a restored pserver climbing back records the count it had)."""
        jobs = await self.bus.kv(TRAINER_JOBS_BUCKET)
        key = progress_key(self.spec.job, self.index)
        failing = False  # say it once, not once per batch
        while True:
            await self.progressed.wait()
            self.progressed.clear()
            ledger = self.state.ledger
            progress = PServerProgress(applied=max(ledger.applied_batches, ledger.high_water))
            try:
                await jobs.put(key, progress)
                failing = False
            except Exception as error:  # the next applied batch records it again
                level = logging.DEBUG if failing else logging.WARNING
                log.log(level, "job %s: progress record failed: %s", self.spec.job, error)
                failing = True

    async def checkpoint(self) -> None:
        version = self.state.ledger.applied_batches
        if version == self.checkpointed_version or not self.state.initialised:
            return
        started = time.monotonic()
        await store_object(
            self.bus, checkpoint_name(self.spec.job, self.index), encode_checkpoint(self.state)
        )
        self.checkpointed_version = version
        CHECKPOINTS.inc()
        log.info(
            "job %s: pserver %d checkpointed %d batches (watermark %d) in %.2fs",
            self.spec.job,
            self.index,
            version,
            self.state.ledger.watermark,
            time.monotonic() - started,
        )


async def _holds(lease: Lease, what: str) -> bool | None:
    """Acquire or renew the lease: whether this pserver holds it, or None while NATS cannot
    tell (then no other pserver can take it either)."""
    try:
        return await lease.try_acquire()
    except Exception as error:  # NATS restarting: ask again next tick
        log.warning("%s: lease not reachable: %s", what, error)
        return None


async def _acquire(lease: Lease, context: ServiceContext, clock: Clock, what: str) -> bool:
    """Whether this pserver took the lease (False: stopped first)."""

    async def held() -> bool | None:
        return await _holds(lease, what) or None

    acquired = await poll_until(
        held,
        clock=clock,
        stopping=context.stopping,
        every=lease.ttl_seconds / 5,
        waiting=f"{what}: another pserver holds the lease; standing by",
    )
    return bool(acquired)


async def _was_reset(server: ParameterServer) -> bool:
    """Whether the job's model is no longer the one served (`tideshift training reset`);
    then its checkpoint and progress are forgotten (again: one may have been written since)."""
    job = server.spec.job
    try:
        if await read_generation(server.bus, job) == server.generation:
            return False
    except Exception as error:  # NATS restarting: ask again next tick
        log.warning("job %s: cannot read the model's generation: %s", job, error)
        return False
    log.warning(
        "job %s: pserver %d: the job was reset; dropping its model and progress, waiting for "
        "a trainer to initialise it again",
        job,
        server.index,
    )
    try:
        await forget(server.bus, job, server.index)
    except Exception as error:  # the reset itself already emptied them
        log.warning(
            "job %s: pserver %d: forgetting its checkpoint failed: %s", job, server.index, error
        )
    return True


async def _serve_while_leading(
    server: ParameterServer,
    lease: Lease,
    settings: PServerSettings,
    context: ServiceContext,
    clock: Clock,
) -> Literal["stopped", "lost", "reset"]:
    """Serve until stopping, the lease is lost or the job is reset."""
    bus, job, index = context.bus, server.spec.job, server.index
    stops = [
        await bus.serve(pserver_subject(job, index, "init"), server.on_init),
        await bus.serve(pserver_subject(job, index, "params"), server.on_params),
        await bus.serve(pserver_subject(job, index, "push"), server.on_push),
        await bus.serve(pserver_subject(job, index, "status"), server.on_status),
    ]
    recorder = asyncio.create_task(server.record_progress())
    context.ready.set()
    log.info("job %s: pserver %d serving %d pieces", job, index, len(server.state.owned()))
    tick = min(settings.checkpoint_seconds, settings.lease_seconds / 3)
    last_checkpoint = clock.now()
    outcome: Literal["stopped", "lost", "reset"] = "stopped"
    try:
        while not await wait_for_event(clock, context.stopping, tick):
            if await _holds(lease, f"job {job} pserver {index}") is False:
                log.error("job %s: pserver %d lost its lease; standing down", job, index)
                outcome = "lost"
                return outcome
            if await _was_reset(server):
                outcome = "reset"
                return outcome
            if clock.now() - last_checkpoint >= settings.checkpoint_seconds:
                try:
                    await server.checkpoint()
                except Exception as error:  # a failed checkpoint is retried next time
                    log.warning("job %s: checkpoint failed: %s", job, error)
                last_checkpoint = clock.now()
        return outcome
    finally:
        server.accepting = False
        context.ready.clear()
        recorder.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await recorder
        for stop in stops:
            await stop()
        if outcome == "stopped":  # never overwrite a successor's or a reset's checkpoint
            await server.checkpoint()
        if outcome != "lost":
            await lease.release()


async def run(
    settings: PServerSettings, context: ServiceContext, *, clock: Clock = WALL_CLOCK
) -> None:
    """The service body; the demo passes its simulated clock."""
    bus, stopping = context.bus, context.stopping
    spec = await wait_for_spec(bus, settings.job, clock=clock, stopping=stopping)
    if spec is None:
        return
    if settings.index >= spec.pservers:
        raise ValueError(
            f"--index {settings.index} out of range: job {spec.job} has {spec.pservers} pservers"
        )
    what = f"job {spec.job} pserver {settings.index}"
    lease = await bus.lease(
        lease_name(spec.job, settings.index),
        holder=context.instance,
        ttl_seconds=settings.lease_seconds,
    )
    # Each round serves one model: after a reset, wait for the next one.
    while (found := await wait_for_layout(bus, spec, clock=clock, stopping=stopping)) is not None:
        layout, generation = found
        if not await _acquire(lease, context, clock, what):
            break
        if await read_generation(bus, spec.job) != generation:  # reset while standing by
            await lease.release()
            continue
        state = await restore(bus, spec, layout, settings.index)
        server = ParameterServer(bus, spec, state, generation)
        VERSION.set(server.state.ledger.applied_batches)
        if await _serve_while_leading(server, lease, settings, context, clock) == "stopped":
            break
    log.info("%s stopped", what)


def main(argv: Sequence[str]) -> int:
    settings = parse_settings(PServerSettings, argv, prog="tideshift run pserver")
    return run_service("pserver", settings, partial(run, settings))
