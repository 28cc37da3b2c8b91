"""Finding a job's spec: pservers and trainers wait for the coordinator to publish it."""

from __future__ import annotations

import asyncio
import contextlib
import logging

from pydantic import ValidationError

from tideshift.services.common.bus import Bus
from tideshift.services.trainer.busport import JOBS_BUCKET, job_key
from tideshift.services.trainer.jobspec import JobSpec

log = logging.getLogger("tideshift.trainer")
SPEC_POLL_SECONDS = 0.5


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
