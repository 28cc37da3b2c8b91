"""Finding a job's spec and model layout: pservers and trainers wait for the coordinator to
publish the spec and for the first trainer to publish the layout; `poll_until` is how every
trainer service waits for something another process publishes."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

from pydantic import ValidationError

from tideshift.events import TRAINER_JOBS_BUCKET
from tideshift.services.common.bus import Bus
from tideshift.services.common.clock import WALL_CLOCK, Clock, wait_for_event
from tideshift.services.trainer.core.jobspec import JobSpec, StoredLayout
from tideshift.services.trainer.core.layout import Layout, LayoutError, plan, specs_from_json
from tideshift.services.trainer.port.bus import job_key

log = logging.getLogger("tideshift.trainer")
R = TypeVar("R")
SPEC_POLL_SECONDS = 0.5
LAYOUT_POLL_SECONDS = 0.2
TRAINER_POLL_SECONDS = 0.2
WAITING_EVERY_SECONDS = 5.0  # how often a trainer waiting for its coordinator says so


async def poll_until(
    read: Callable[[], Awaitable[R | None]],
    *,
    clock: Clock,
    stopping: asyncio.Event,
    every: float,
    waiting: str,
) -> R | None:
    """`read()`'s first answer that is not None, asking every `every` seconds of `clock`
    time; None once `stopping` is set. Logs `waiting` once, when the first answer is None."""
    announced = False
    while not stopping.is_set():
        found = await read()
        if found is not None:
            return found
        if not announced:
            log.info("%s", waiting)
            announced = True
        if await wait_for_event(clock, stopping, every):
            break
    return None


async def read_spec(bus: Bus, job: str) -> JobSpec | None:
    kv = await bus.kv(TRAINER_JOBS_BUCKET)
    try:
        return await kv.get(job_key(job, "spec"), JobSpec)
    except ValidationError as error:
        log.error("job %s: stored spec is invalid: %s", job, error)
        return None


async def wait_for_spec(
    bus: Bus, job: str, *, clock: Clock, stopping: asyncio.Event
) -> JobSpec | None:
    """The job's spec once the coordinator wrote it, or None if stopped first."""
    return await poll_until(
        lambda: read_spec(bus, job),
        clock=clock,
        stopping=stopping,
        every=SPEC_POLL_SECONDS,
        waiting=f"job {job}: waiting for its coordinator to publish the job spec",
    )


async def wait_for_spec_saying_so(
    bus: Bus, job: str, timeout: float, stopping: asyncio.Event
) -> JobSpec | None:
    """A trainer's wait for the job's spec, a WARNING at once and every few seconds (shown
    without logging set up); None once `stopping` is set; TimeoutError after `timeout` s."""
    started = time.monotonic()
    say_at = started
    while (spec := await read_spec(bus, job)) is None:
        waited = time.monotonic() - started
        if waited >= timeout:
            raise TimeoutError(
                f"job {job}: no job spec published within {timeout:.0f}s (is its coordinator up?)"
            )
        if time.monotonic() >= say_at:
            log.warning(
                "job %s: waiting for its coordinator to publish the job spec (%.0fs of %.0fs)",
                job,
                waited,
                timeout,
            )
            say_at += WAITING_EVERY_SECONDS
        if await wait_for_event(WALL_CLOCK, stopping, TRAINER_POLL_SECONDS):
            return None
    return spec


async def _stored_layout(bus: Bus, job: str) -> StoredLayout | None:
    kv = await bus.kv(TRAINER_JOBS_BUCKET)
    return await kv.get(job_key(job, "layout"), StoredLayout)


async def read_generation(bus: Bus, job: str) -> str | None:
    """The generation of the job's model (StoredLayout.generation); None before the first
    `initialize()` or after a reset."""
    try:
        stored = await _stored_layout(bus, job)
    except ValidationError:
        return None
    return None if stored is None else stored.generation


async def read_layout_generation(bus: Bus, spec: JobSpec) -> tuple[Layout, str] | None:
    """The model's layout and generation once a trainer initialised the job; None before."""
    try:
        stored = await _stored_layout(bus, spec.job)
        if stored is None:
            return None
        layout = plan(
            specs_from_json(stored.arrays), spec.pservers, max_piece_bytes=spec.max_piece_bytes
        )
    except (ValidationError, LayoutError) as error:
        log.error("job %s: stored layout is invalid: %s", spec.job, error)
        return None
    return layout, stored.generation


async def read_layout(bus: Bus, spec: JobSpec) -> Layout | None:
    """The model's layout once a trainer initialised the job; None before."""
    found = await read_layout_generation(bus, spec)
    return None if found is None else found[0]


async def wait_for_layout(
    bus: Bus, spec: JobSpec, *, clock: Clock, stopping: asyncio.Event
) -> tuple[Layout, str] | None:
    """The model's layout and generation once the first trainer wrote it, or None if
    stopped first."""
    return await poll_until(
        lambda: read_layout_generation(bus, spec),
        clock=clock,
        stopping=stopping,
        every=LAYOUT_POLL_SECONDS,
        waiting=f"job {spec.job}: waiting for a trainer to initialise the model",
    )
