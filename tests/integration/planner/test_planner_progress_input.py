"""A training job's progress reaches the planner's plan over a real nats-server: the
coordinator's reports (`tideshift.v1.training.progress.<job>`) set the finite job's remaining
work on its TrainingJob; a report for a job the planner does not manage is dropped at the
next plan."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import pytest

from tests.unit.planner.progress_support import ignored, progress_report
from tideshift.events import JOB_PROGRESS
from tideshift.services.common.bus import Bus
from tideshift.services.planner.service import Planner
from tideshift.services.planner.settings import PlannerSettings, TrainingTarget

pytestmark = pytest.mark.timeout(120)


async def until(predicate: Callable[[], bool], *, what: str) -> None:
    """Poll `predicate` for up to 15 s."""
    for _ in range(750):
        if predicate():
            return
        await asyncio.sleep(0.02)
    raise AssertionError(f"not {what} within 15 s")


def remaining(planner: Planner, job: str) -> float | None:
    jobs = planner.state.inputs(time.time()).jobs
    return next(item.remaining_work for item in jobs if item.target.name == job)


async def test_a_finite_jobs_progress_sets_its_remaining_work(bus: Bus, unique: str) -> None:
    job, stranger = f"train-{unique}", f"other-{unique}"
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
        assert remaining(planner, job) is None
        now = time.time()
        for at, done in ((now - 100, 0), (now, 50)):
            await bus.publish(JOB_PROGRESS.at(job=job), progress_report(job, at, done))
        await until(lambda: remaining(planner, job) is not None, what="estimated")
        # 50 shards in 100 s at 10 trainers, 350 left: 700 s at 10 trainers.
        assert remaining(planner, job) == pytest.approx(700.0 * 10**0.8)
        dropped = ignored("unplanned")
        await bus.publish(JOB_PROGRESS.at(job=stranger), progress_report(stranger, now, 0))
        # A plan of the planner's own may drop it first.
        await until(
            lambda: stranger in planner.state.progress.histories or ignored("unplanned") > dropped,
            what="received",
        )
        remaining(planner, job)  # a plan's inputs: the stranger's history goes
        assert stranger not in planner.state.progress.histories
        assert ignored("unplanned") == dropped + 1
    finally:
        planner.stopping.set()
        await asyncio.wait_for(task, 30)
