"""The planner follows a real training job's progress: the real coordinator, parameter server
and trainers (`python -m tideshift.services.cli run ...`) train on a real nats-server, the
coordinator (started with --epochs) reports its progress, and the real planner, which plans
that job, sets its remaining work from the reports: an estimate that falls as the job goes on,
and none once it is finished."""

from __future__ import annotations

import asyncio
import json
import math
import time
from pathlib import Path

import pytest
from trainer_harness import JobHarness, wait_until

from tideshift.services.common.bus import Bus
from tideshift.services.common.embedded_nats import EmbeddedNats
from tideshift.services.planner.service import Planner
from tideshift.services.planner.settings import PlannerSettings, TrainingTarget
from tideshift.services.trainer.core.model import DatasetSpec, dataset_uris

pytestmark = pytest.mark.timeout(420)


def remaining(planner: Planner) -> float | None:
    (job,) = planner.state.inputs(time.time()).jobs
    return job.remaining_work


async def test_the_planner_estimates_a_running_jobs_remaining_work(
    bus: Bus, nats_server: EmbeddedNats, tmp_path: Path, unique: str
) -> None:
    data = DatasetSpec(
        seed=7, num_shards=16, samples_per_shard=2000, holdout_samples=1000, batch_size=500
    )
    harness = JobHarness(
        nats_server.url,
        f"progress-{unique}",
        tmp_path,
        coordinator_args=[
            "--epochs", "6", "--dataset", json.dumps(dataset_uris(data)), "--pservers", "1",
        ],
    )  # fmt: skip
    settings = PlannerSettings(
        training=[TrainingTarget(namespace=unique, name=harness.job, cpu=1.0, max_trainers=4)],
        tick_seconds=600.0,
        lease_name=f"planner-{unique}",
        lease_ttl_seconds=1.0,
        snapshot_bucket=f"snapshot_{unique}",
        health_port=-1,
    )
    planner = Planner(bus, settings, f"planner-{unique}", asyncio.Event())
    task = asyncio.create_task(planner.run())
    estimates: list[float] = []

    async def estimate_falls() -> bool:
        work = remaining(planner)
        if work is not None:
            estimates.append(work)
        return len(estimates) >= 2 and estimates[-1] < estimates[0]

    try:
        await asyncio.wait_for(planner.ready.wait(), 15)
        harness.pserver(0).start()
        for name in ("t1", "t2"):
            harness.trainer(name).start()
        coordinator = harness.coordinator().start()
        await wait_until(
            estimate_falls,
            timeout=240,
            what="a remaining work that falls",
            explain=coordinator.tail,
        )
        assert all(math.isfinite(work) and work > 0 for work in estimates)
        assert await coordinator.wait(240) == 0, coordinator.tail()

        async def forgotten() -> bool:
            return remaining(planner) is None

        # The coordinator's last report says the job is finished: its history goes.
        await wait_until(forgotten, timeout=15, what="the finished job's estimate dropped")
    finally:
        harness.kill_all()
        planner.stopping.set()
        await asyncio.wait_for(task, 30)
