"""`tideshift training status|export|reset --job NAME`: a training job seen from outside.

status: the job's epochs, shards applied, pservers and live trainers, as one JSON line.
export: the pservers' current parameters to a `.npz` file of named arrays (what
    `ElasticJob.initialize` was given, as trained so far); `export_model` is the same in Python.
reset: forget the job's layout, coordinator progress and pserver checkpoints, so the next
    `initialize()` fixes the layout again. The job's running coordinator and pservers see
    the layout go (or change) within a tick and start over at epoch 0; stop the trainers
    of the wrong model first, or the first of them to call `initialize()` fixes it again.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from tideshift.events import TRAINER_JOBS_BUCKET, TRAINER_MEMBERS_BUCKET
from tideshift.events.tokens import decode_token
from tideshift.services.common.bus import Bus, RequestFailed
from tideshift.services.trainer.core.jobspec import JobSpec, PersistedCoordinator
from tideshift.services.trainer.port.bus import (
    MEMBER_TTL_SECONDS,
    job_key,
    member_prefix,
)
from tideshift.services.trainer.port.jobs import read_layout, read_spec
from tideshift.services.trainer.port.pserver_client import PServerClient, StatusClient
from tideshift.services.trainer.pserver.store import forget

PROG = "tideshift training"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    for name, text in (
        ("status", "epochs, shards applied, pservers and live trainers of a job"),
        ("export", "write the pservers' current parameters to a .npz file"),
        ("reset", "forget a job's layout, progress and checkpoints (stop its trainers first)"),
    ):
        command = commands.add_parser(name, help=text, description=text)
        command.add_argument("--job", required=True, help="training job name")
        command.add_argument(
            "--nats-url",
            default=os.environ.get("TIDESHIFT_NATS_URL"),
            help="NATS server (default: $TIDESHIFT_NATS_URL)",
        )
        if name == "export":
            command.add_argument("--out", required=True, type=Path, help="the .npz file")
    return parser


async def _spec(bus: Bus, job: str) -> JobSpec:
    spec = await read_spec(bus, job)
    if spec is None:
        raise ValueError(f"job {job}: no job spec on the bus (has its coordinator run?)")
    return spec


async def pull_model(bus: Bus, job: str) -> dict[str, np.ndarray]:
    """The pservers' current parameters of `job` (ValueError if it has none yet)."""
    spec = await _spec(bus, job)
    layout = await read_layout(bus, spec)
    if layout is None:
        raise ValueError(f"job {job}: no model yet (no trainer called initialize())")
    try:
        return await PServerClient(bus, spec, layout).pull()
    except RequestFailed as error:
        raise ValueError(f"job {job}: the pservers did not answer: {error}") from error


def export_model(job: str, nats_url: str, out: Path | None = None) -> dict[str, np.ndarray]:
    """The trained parameters of `job`, from its running pservers, as named arrays (the
    names `initialize()` was given); also written to `out` (.npz) when given."""

    async def pull() -> dict[str, np.ndarray]:
        bus = await Bus.connect(nats_url, name="training-export")
        try:
            return await pull_model(bus, job)
        finally:
            await bus.close()

    arrays = asyncio.run(pull())
    if out is not None:
        np.savez(out, **arrays)  # type: ignore[arg-type]  # names are str keys
    return arrays


async def status(bus: Bus, job: str) -> dict[str, Any]:
    spec = await _spec(bus, job)
    jobs = await bus.kv(TRAINER_JOBS_BUCKET)
    stored = await jobs.get(job_key(job, "state"), PersistedCoordinator)
    state = stored.state if stored is not None else {}
    members = await bus.kv(TRAINER_MEMBERS_BUCKET, ttl_seconds=MEMBER_TTL_SECONDS)
    prefix = member_prefix(job)
    trainers = sorted(
        decode_token(k[len(prefix) :]) for k in await members.keys() if k.startswith(prefix)
    )
    try:
        pservers: list[dict[str, Any]] | str = [
            {"index": s.index, "initialised": s.initialised, "batches_applied": s.version,
             "duplicates_refused": s.duplicates, "retrained": s.retrained,
             "watermark": s.watermark}
            for s in await StatusClient(bus, spec).status()
        ]  # fmt: skip
    except RequestFailed as error:
        pservers = f"not all answering: {error}"
    return {
        "job": job,
        "finished": bool(state.get("finished", False)),
        "epoch": state.get("epoch", 0),
        "epochs": state.get("epochs"),
        "shards": spec.num_shards,
        "shards_applied_in_epoch": len(state.get("applied", [])),  # type: ignore[arg-type]
        "model": await read_layout(bus, spec) is not None,
        "pservers": pservers,
        "trainers": trainers,
    }


async def reset(bus: Bus, job: str) -> dict[str, Any]:
    spec = await _spec(bus, job)
    jobs = await bus.kv(TRAINER_JOBS_BUCKET)
    for part in ("layout", "state"):  # the spec stays: the coordinator rewrites it
        await jobs.delete(job_key(job, part))
    for index in range(spec.pservers):
        await forget(bus, job, index)
    return {"job": job, "reset": True, "pservers": spec.pservers}


async def _run(args: argparse.Namespace) -> dict[str, Any]:
    bus = await Bus.connect(args.nats_url, name=f"training-{args.command}")
    try:
        if args.command == "status":
            return await status(bus, args.job)
        if args.command == "reset":
            return await reset(bus, args.job)
        arrays = await pull_model(bus, args.job)
    finally:
        await bus.close()
    np.savez(args.out, **arrays)  # type: ignore[arg-type]
    return {"job": args.job, "out": str(args.out), "arrays": sorted(arrays)}


def main(argv: Sequence[str]) -> int:
    args = build_parser().parse_args(argv)
    if not args.nats_url:
        print(f"{PROG}: --nats-url (env TIDESHIFT_NATS_URL) is required", file=sys.stderr)
        return 2
    try:
        print(json.dumps(asyncio.run(_run(args))))
    except (ValueError, ConnectionError, OSError) as error:
        print(f"{PROG} {args.command}: {error}", file=sys.stderr)
        return 1
    return 0
