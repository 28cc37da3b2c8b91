"""Finding a job's spec and model layout: pservers and trainers wait for the coordinator to
publish the spec and for the first trainer to publish the layout."""

from __future__ import annotations

import asyncio
import contextlib
import logging

from pydantic import ValidationError

from tideshift.services.common.bus import Bus
from tideshift.services.trainer.busport import JOBS_BUCKET, job_key
from tideshift.services.trainer.jobspec import JobSpec, StoredLayout
from tideshift.services.trainer.layout import Layout, LayoutError, plan, specs_from_json

log = logging.getLogger("tideshift.trainer")
SPEC_POLL_SECONDS = 0.5
LAYOUT_POLL_SECONDS = 0.2


async def read_spec(bus: Bus, job: str) -> JobSpec | None:
    kv = await bus.kv(JOBS_BUCKET)
    try:
        return await kv.get(job_key(job, "spec"), JobSpec)
    except ValidationError as error:
        log.error("job %s: stored spec is invalid: %s", job, error)
        return None


async def wait_for_spec(bus: Bus, job: str, stopping: asyncio.Event) -> JobSpec | None:
    """The job's spec once the coordinator wrote it, or None if stopped first."""
    announced = False
    while not stopping.is_set():
        spec = await read_spec(bus, job)
        if spec is not None:
            return spec
        if not announced:
            log.info("job %s: waiting for its coordinator to publish the job spec", job)
            announced = True
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stopping.wait(), SPEC_POLL_SECONDS)
    return None


async def sleep_unless(stopping: asyncio.Event, seconds: float) -> bool:
    """Sleep up to `seconds`; True if `stopping` was set meanwhile."""
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(stopping.wait(), seconds)
    return stopping.is_set()


async def read_layout(bus: Bus, spec: JobSpec) -> Layout | None:
    """The model's layout once a trainer initialised the job; None before."""
    kv = await bus.kv(JOBS_BUCKET)
    try:
        stored = await kv.get(job_key(spec.job, "layout"), StoredLayout)
        if stored is None:
            return None
        return plan(
            specs_from_json(stored.arrays), spec.pservers, max_piece_bytes=spec.max_piece_bytes
        )
    except (ValidationError, LayoutError) as error:
        log.error("job %s: stored layout is invalid: %s", spec.job, error)
        return None


async def wait_for_layout(bus: Bus, spec: JobSpec, stopping: asyncio.Event) -> Layout | None:
    """The model's layout once the first trainer wrote it, or None if stopped first."""
    announced = False
    while not stopping.is_set():
        layout = await read_layout(bus, spec)
        if layout is not None:
            return layout
        if not announced:
            log.info("job %s: waiting for a trainer to initialise the model", spec.job)
            announced = True
        if await sleep_unless(stopping, LAYOUT_POLL_SECONDS):
            break
    return None
