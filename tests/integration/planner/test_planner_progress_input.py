"""A training job's progress reaches the planner's plan over a real nats-server: the
coordinator's reports (`tideshift.v1.training.progress.<job>`) set the finite job's remaining
work on its TrainingJob; a report for a job the planner does not manage is dropped at the
next plan."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime, timedelta

import pytest

from tideshift.events import JOB_PROGRESS, JobProgress
from tideshift.services.common.bus import Bus
from tideshift.services.planner.service import Planner
from tideshift.services.planner.settings import PlannerSettings, TrainingTarget

pytestmark = pytest.mark.timeout(120)


async def eventually(predicate: Callable[[], bool], timeout: float = 15.0) -> None:
    """Wait for a condition (polled), failing after `timeout` seconds."""
    deadline = asyncio.get_running_loop().time() + timeout
    while not predicate():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError("condition not reached in time")
        await asyncio.sleep(0.02)


@contextlib.asynccontextmanager
async def running(bus: Bus, unique: str, job: str) -> AsyncIterator[Planner]:
    settings = PlannerSettings(
        training=[TrainingTarget(namespace=unique, name=job, cpu=1.0, max_trainers=20)],
        tick_seconds=600.0,
        lease_name=f"planner-{unique}",
        lease_ttl_seconds=1.0,
        snapshot_bucket=f"snapshot_{unique}",
        health_port=-1,
    )
    planner = Planner(bus, settings, f"planner-{unique}", asyncio.Event())
    task = asyncio.create_task(planner.run())
    try:
        await asyncio.wait_for(planner.ready.wait(), 15)
        yield planner
    finally:
        planner.stopping.set()
        await asyncio.wait_for(task, 30)


def report(job: str, at: datetime, done: int) -> JobProgress:
    # 4 epochs of 100 shards, 10 trainers.
    return JobProgress(
        job=job,
        state="running",
        epoch=done // 100,
        epochs=4,
        shards=100,
        applied_in_epoch=done % 100,
        applied_total=done,
        in_flight=0,
        redelivered=0,
        trainers=10,
        at=at,
    )


def remaining(planner: Planner, job: str) -> float | None:
    jobs = planner.state.inputs(time.time()).jobs
    return next(item.remaining_work for item in jobs if item.target.name == job)


async def test_a_finite_jobs_progress_sets_its_remaining_work(bus: Bus, unique: str) -> None:
    job, stranger = f"train-{unique}", f"other-{unique}"
    async with running(bus, unique, job) as planner:
        assert remaining(planner, job) is None
        now = datetime.now(UTC)
        for at, done in ((now - timedelta(seconds=100), 0), (now, 50)):
            await bus.publish(JOB_PROGRESS.at(job=job), report(job, at, done))
        await eventually(lambda: remaining(planner, job) is not None)
        # 50 shards in 100 s at 10 trainers, 350 left: 700 s at 10 trainers.
        assert remaining(planner, job) == pytest.approx(700.0 * 10**0.8)
        await bus.publish(JOB_PROGRESS.at(job=stranger), report(stranger, now, 0))
        await eventually(lambda: stranger in planner.state.progress.histories)
        remaining(planner, job)  # a plan's inputs: the stranger's history goes
        assert stranger not in planner.state.progress.histories
