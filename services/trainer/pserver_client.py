"""Talking to a job's parameter servers: pull the whole vector, push a gradient, ask status.

With several pservers each owns one key range; a pull concatenates their slices and a push
sends each its slice. A shard counts as applied only once every pserver applied it.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

import numpy as np

from tideshift.services.common.bus import Bus, RequestFailed
from tideshift.services.trainer.busport import pserver_subject
from tideshift.services.trainer.jobspec import JobSpec
from tideshift.services.trainer.model import FloatArray
from tideshift.services.trainer.wire import WireError, header_int, pack, unpack


@dataclass(frozen=True)
class PushReply:
    index: int
    outcome: str  # applied | duplicate | rejected
    reason: str


@dataclass(frozen=True)
class PServerStatus:
    index: int
    version: int
    applied_total: int
    redelivered: int
    duplicates: int  # gradients pushed for shards already applied (wasted work)
    applied: frozenset[tuple[int, int]]  # only epochs >= the requested from_epoch
    missing: frozenset[tuple[int, int]]  # epochs < from_epoch, not applied here


def _error_of(header: dict[str, object]) -> str | None:
    error = header.get("error")
    return str(error) if error is not None else None


def _unpack_reply(subject: str, raw: bytes) -> tuple[dict[str, object], dict[str, np.ndarray]]:
    if raw.startswith(b"error: "):
        raise RequestFailed(f"{subject}: {raw.decode(errors='replace')}")
    try:
        header, arrays = unpack(raw)
    except WireError as error:
        raise RequestFailed(f"{subject}: malformed reply: {error}") from error
    if (message := _error_of(header)) is not None:
        raise RequestFailed(f"{subject}: {message}")
    return header, arrays


class PServerClient:
    def __init__(self, bus: Bus, spec: JobSpec, *, timeout: float = 5.0) -> None:
        self.bus = bus
        self.spec = spec
        self.timeout = timeout

    async def _params_of(self, index: int) -> FloatArray:
        subject = pserver_subject(self.spec.job, index, "params")
        raw = await self.bus.request(subject, pack({"job": self.spec.job}), timeout=self.timeout)
        _, arrays = _unpack_reply(subject, raw)
        params = arrays.get("params")
        expected = self.spec.key_ranges[index]
        if params is None or params.shape != (expected.size,):
            raise RequestFailed(f"{subject}: expected {expected.size} parameters")
        return np.asarray(params, dtype=np.float64)

    async def pull(self) -> FloatArray:
        """The whole parameter vector; raises RequestFailed if any pserver does not answer."""
        slices = await asyncio.gather(
            *(self._params_of(index) for index in range(self.spec.pservers))
        )
        return np.concatenate(slices)

    async def _push_to(
        self,
        index: int,
        *,
        epoch: int,
        shard: int,
        delivery: int,
        gradient: FloatArray,
        trainer: str,
    ) -> PushReply:
        key_range = self.spec.key_ranges[index]
        subject = pserver_subject(self.spec.job, index, "push")
        payload = pack(
            {
                "job": self.spec.job,
                "epoch": epoch,
                "shard": shard,
                "delivery": delivery,
                "start": key_range.start,
                "stop": key_range.stop,
                "trainer": trainer,
            },
            {"gradient": gradient[key_range.start : key_range.stop]},
        )
        raw = await self.bus.request(subject, payload, timeout=self.timeout)
        header, _ = _unpack_reply(subject, raw)
        return PushReply(
            index=index, outcome=str(header.get("outcome")), reason=str(header.get("reason", ""))
        )

    async def push(
        self, *, epoch: int, shard: int, delivery: int, gradient: FloatArray, trainer: str
    ) -> list[PushReply]:
        return list(
            await asyncio.gather(
                *(
                    self._push_to(
                        index,
                        epoch=epoch,
                        shard=shard,
                        delivery=delivery,
                        gradient=gradient,
                        trainer=trainer,
                    )
                    for index in range(self.spec.pservers)
                )
            )
        )

    async def _status_of(self, index: int, from_epoch: int) -> PServerStatus:
        subject = pserver_subject(self.spec.job, index, "status")
        raw = await self.bus.request(
            subject,
            pack({"job": self.spec.job, "from_epoch": from_epoch, "shards": self.spec.shards}),
            timeout=self.timeout,
        )
        header, arrays = _unpack_reply(subject, raw)
        applied, missing = arrays.get("applied"), arrays.get("missing")
        for name, pairs in (("applied", applied), ("missing", missing)):
            if pairs is None or pairs.ndim != 2 or pairs.shape[1] != 2:
                raise RequestFailed(f"{subject}: {name} must have shape (n, 2)")
        assert applied is not None and missing is not None
        try:
            return PServerStatus(
                index=index,
                version=header_int(header, "version", minimum=0),
                applied_total=header_int(header, "applied_total", minimum=0),
                redelivered=header_int(header, "redelivered", minimum=0),
                duplicates=header_int(header, "duplicates", minimum=0),
                applied=frozenset((int(e), int(s)) for e, s in applied),
                missing=frozenset((int(e), int(s)) for e, s in missing),
            )
        except WireError as error:
            raise RequestFailed(f"{subject}: {error}") from error

    async def status(self, *, from_epoch: int = 0) -> list[PServerStatus]:
        return list(
            await asyncio.gather(
                *(self._status_of(index, from_epoch) for index in range(self.spec.pservers))
            )
        )
