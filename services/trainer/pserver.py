"""`tideshift run pserver --job NAME [--index I]`: one key range of a job's parameters.

Serves parameter pulls and gradient pushes over NATS request/reply, applies each
(epoch, shard) at most once (protocol.handle_push), and checkpoints parameters, Adagrad state
and the applied set together to the JetStream object store every few seconds and on SIGTERM.
On start it restores the last checkpoint, so a restart loses at most the applies since then;
the coordinator notices those shards are no longer applied and publishes them again.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from functools import partial

import numpy as np
from prometheus_client import Counter, Gauge
from pydantic import Field

from tideshift.events.tokens import encode_token
from tideshift.services.common.bus import Bus
from tideshift.services.common.runtime import ServiceContext, run_service
from tideshift.services.common.settings import ServiceSettings, parse_settings
from tideshift.services.trainer.busport import load_object, pserver_subject, store_object
from tideshift.services.trainer.checkpoint import decode_checkpoint, encode_checkpoint
from tideshift.services.trainer.jobs import sleep_unless, wait_for_spec
from tideshift.services.trainer.jobspec import JobSpec
from tideshift.services.trainer.model import KeyRange, initial_state
from tideshift.services.trainer.protocol import (
    GradientPush,
    PServerState,
    PushOutcome,
    PushResult,
    handle_push,
)
from tideshift.services.trainer.wire import WireError, header_int, header_str, pack, unpack

log = logging.getLogger("tideshift.pserver")

PUSHES = Counter("tideshift_pserver_pushes_total", "Gradient pushes by outcome", ["outcome"])
VERSION = Gauge("tideshift_pserver_version", "Gradients applied so far")
CHECKPOINTS = Counter("tideshift_pserver_checkpoints_total", "Checkpoints written")


class PServerSettings(ServiceSettings):
    """Parameter server of one elastic training job (one key range of its model)."""

    job: str = Field(min_length=1, max_length=253, description="training job name")
    index: int = Field(default=0, ge=0, description="which key range this pserver owns (0-based)")
    checkpoint_seconds: float = Field(
        default=5.0, gt=0, description="seconds between checkpoints while gradients arrive"
    )


def checkpoint_name(job: str, index: int) -> str:
    return f"{encode_token(job)}.pserver-{index}"


class ParameterServer:
    def __init__(self, bus: Bus, spec: JobSpec, index: int, state: PServerState) -> None:
        self.bus = bus
        self.spec = spec
        self.index = index
        self.state = state
        self.accepting = True
        self.checkpointed_version = state.version
        self.duplicates = 0  # pushes of already-applied shards since this process started

    @property
    def key_range(self) -> KeyRange:
        return self.state.optimizer.key_range

    def _refuse(self) -> bytes | None:
        if not self.accepting:
            return pack({"error": "pserver is stopping; retry shortly"})
        return None

    async def on_params(self, raw: bytes) -> bytes:
        if (refusal := self._refuse()) is not None:
            return refusal
        try:
            header, _ = unpack(raw)
            job = header_str(header, "job")
        except WireError as error:
            return pack({"error": f"malformed params request: {error}"})
        if job != self.spec.job:
            return pack({"error": f"unknown job {job!r}: this pserver serves {self.spec.job!r}"})
        state = self.state
        return pack(
            {
                "job": state.job,
                "index": self.index,
                "start": self.key_range.start,
                "stop": self.key_range.stop,
                "version": state.version,
            },
            {"params": state.optimizer.params},
        )

    def _decode_push(self, raw: bytes) -> GradientPush:
        header, arrays = unpack(raw)
        gradient = arrays.get("gradient")
        if gradient is None:
            raise WireError("missing array 'gradient'")
        return GradientPush(
            job=header_str(header, "job"),
            epoch=header_int(header, "epoch"),
            shard=header_int(header, "shard"),
            delivery=header_int(header, "delivery"),
            key_range=KeyRange(header_int(header, "start"), header_int(header, "stop")),
            gradient=gradient,
        )

    async def on_push(self, raw: bytes) -> bytes:
        if (refusal := self._refuse()) is not None:
            return refusal
        try:
            push = self._decode_push(raw)
        except WireError as error:
            result = PushResult(PushOutcome.REJECTED, f"malformed gradient push: {error}")
        else:
            # No await between reading and replacing the state: pushes apply atomically.
            self.state, result = handle_push(
                self.state,
                push,
                learning_rate=self.spec.learning_rate,
                num_shards=self.spec.shards,
            )
        PUSHES.labels(result.outcome.value).inc()
        if result.outcome is PushOutcome.DUPLICATE:
            self.duplicates += 1
        VERSION.set(self.state.version)
        if result.outcome is PushOutcome.REJECTED:
            log.warning("job %s: rejected a gradient push: %s", self.spec.job, result.reason)
        return pack(
            {
                "outcome": result.outcome.value,
                "reason": result.reason,
                "version": self.state.version,
            }
        )

    async def on_status(self, raw: bytes) -> bytes:
        """Applied pairs of epochs >= `from_epoch`, and the pairs of earlier epochs that are
        missing (normally none: only a restore from an older checkpoint loses them)."""
        try:
            header, _ = unpack(raw)
            job = header_str(header, "job")
            from_epoch = header_int(header, "from_epoch", minimum=0)
            shards = header_int(header, "shards", minimum=1)
        except WireError as error:
            return pack({"error": f"malformed status request: {error}"})
        if job != self.spec.job:
            return pack({"error": f"unknown job {job!r}: this pserver serves {self.spec.job!r}"})
        state = self.state
        applied = sorted(key for key in state.applied if key[0] >= from_epoch)
        missing = [
            (epoch, shard)
            for epoch in range(from_epoch)
            for shard in range(shards)
            if (epoch, shard) not in state.applied
        ]
        return pack(
            {
                "job": state.job,
                "index": self.index,
                "version": state.version,
                "applied_total": len(state.applied),
                "redelivered": state.redelivered,
                "duplicates": self.duplicates,
            },
            {
                "applied": np.array(applied, dtype=np.int64).reshape(len(applied), 2),
                "missing": np.array(missing, dtype=np.int64).reshape(len(missing), 2),
            },
        )

    async def checkpoint(self) -> None:
        state = self.state
        if state.version == self.checkpointed_version:
            return
        await store_object(
            self.bus, checkpoint_name(self.spec.job, self.index), encode_checkpoint(state)
        )
        self.checkpointed_version = state.version
        CHECKPOINTS.inc()
        log.info(
            "job %s: pserver %d checkpointed version %d (%d applied)",
            self.spec.job,
            self.index,
            state.version,
            len(state.applied),
        )


async def restore(bus: Bus, spec: JobSpec, index: int) -> PServerState:
    """The last checkpoint, or fresh parameters; raises ValueError on an unusable checkpoint."""
    key_range = spec.key_ranges[index]
    payload = await load_object(bus, checkpoint_name(spec.job, index))
    if payload is None:
        log.info("job %s: pserver %d starts from zero parameters", spec.job, index)
        return PServerState(job=spec.job, optimizer=initial_state(key_range))
    try:
        state = decode_checkpoint(payload, job=spec.job, key_range=key_range)
    except WireError as error:
        raise ValueError(
            f"job {spec.job}: checkpoint of pserver {index} unusable: {error}"
        ) from error
    log.info(
        "job %s: pserver %d restored version %d with %d applied shards",
        spec.job,
        index,
        state.version,
        len(state.applied),
    )
    return state


async def run(settings: PServerSettings, context: ServiceContext) -> None:
    bus = context.bus
    spec = await wait_for_spec(bus, settings.job, context.stopping)
    if spec is None:
        return
    if settings.index >= spec.pservers:
        raise ValueError(
            f"--index {settings.index} out of range: job {spec.job} has {spec.pservers} pservers"
        )
    server = ParameterServer(bus, spec, settings.index, await restore(bus, spec, settings.index))
    VERSION.set(server.state.version)
    stops = [
        await bus.serve(pserver_subject(spec.job, settings.index, "params"), server.on_params),
        await bus.serve(pserver_subject(spec.job, settings.index, "push"), server.on_push),
        await bus.serve(pserver_subject(spec.job, settings.index, "status"), server.on_status),
    ]
    context.ready.set()
    log.info(
        "job %s: pserver %d serving keys [%d, %d)",
        spec.job,
        settings.index,
        server.key_range.start,
        server.key_range.stop,
    )
    try:
        while not await sleep_unless(context.stopping, settings.checkpoint_seconds):
            try:
                await server.checkpoint()
            except Exception as error:  # a failed checkpoint is retried next time
                log.warning("job %s: checkpoint failed: %s", spec.job, error)
    finally:
        server.accepting = False
        for stop in stops:
            await stop()
        await server.checkpoint()
        log.info("job %s: pserver %d stopped after its final checkpoint", spec.job, settings.index)


def main(argv: Sequence[str]) -> int:
    settings = parse_settings(PServerSettings, argv, prog="tideshift run pserver")
    return run_service("pserver", settings, partial(run, settings))
