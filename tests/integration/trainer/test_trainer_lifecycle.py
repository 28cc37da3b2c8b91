"""What a user meets around the job: a trainer started before its coordinator says it is
waiting, and a SIGTERM in that wait ends it with status 0, not Paddle's C++ signal dump; a
batch one pserver already holds (as after the other rolled back) is a duplicate to the
trainer, in the summary and on no other pserver's count; a pserver SIGKILLed and restarted
from an older checkpoint counts the batches it trains again, in the coordinator's summary and
/metrics, and the user's exactly-once check on the summary's documented fields holds."""

from __future__ import annotations

import asyncio
import json
import signal
import socket
import urllib.error
import urllib.request
from pathlib import Path

import numpy as np
import pytest
from trainer_harness import JobHarness, one_shard_job, training, wait_until

from tideshift.events import TRAINER_JOBS_BUCKET
from tideshift.services.common.embedded_nats import EmbeddedNats
from tideshift.services.trainer.core.jobspec import PServerProgress
from tideshift.services.trainer.port.bus import progress_key
from tideshift.services.trainer.port.pserver_client import PushReply
from tideshift.services.trainer.sdk import ElasticJob

pytestmark = pytest.mark.timeout(180)

# Paddle is imported first on purpose: it installs its own SIGTERM handler, which the SDK
# must replace before it starts waiting.
EARLY_TRAINER = """
import paddle
from tideshift.services.trainer.sdk import ElasticJob

job = ElasticJob.connect(spec_timeout=120)
print("connected", flush=True)
"""


async def test_a_trainer_before_its_coordinator_says_it_waits_and_exits_0_on_sigterm(
    nats_server: EmbeddedNats, tmp_path: Path, unique: str
) -> None:
    script = tmp_path / "early_trainer.py"
    script.write_text(EARLY_TRAINER)
    harness = JobHarness(nats_server.url, f"early-{unique}", tmp_path)
    trainer = harness.script("t-early", script, []).start()
    try:

        async def says_it_waits() -> bool:
            return "waiting for its coordinator" in trainer.stderr_path.read_text()

        await wait_until(says_it_waits, timeout=90, what="the trainer's waiting message")
        trainer.signal(signal.SIGTERM)
        assert await trainer.wait(30) == 0, trainer.tail()
        stderr = trainer.stderr_path.read_text()
        assert "FatalError" not in stderr and "Traceback" not in stderr, stderr
        assert "connected" not in trainer.stdout()
    finally:
        harness.kill_all()


def push_after_a_rollback(url: str, job_name: str) -> list[str]:
    """Batch 0 is first applied on pserver 0 alone (what pserver 1 rolling back to a checkpoint
    without it leaves), then pushed by the trainer; batch 1 is pushed normally."""
    with ElasticJob.connect(job_name, nats_url=url, trainer="t-dup", handle_sigterm=False) as job:
        job.initialize({"w": np.zeros(4, dtype=np.float32), "b": np.zeros(2)})
        client = job.client
        assert client is not None
        gradient = {"w": np.ones(4, dtype=np.float32), "b": np.ones(2)}
        outcomes = []
        for task in job.tasks():
            for index in task.batches(lambda location: [0, 1]):
                if index == 0:
                    skip_pserver_1 = {1: PushReply(1, "applied", "", 0)}
                    only_pserver_0 = client.push(
                        gradient, push_id="x", epoch=0, shard=0, batch=0, last=False,
                        answered=skip_pserver_1,
                    )  # fmt: skip
                    job._loop.run(only_pserver_0)
                outcomes.append(task.push(gradient, samples=1))
        return outcomes


async def test_a_batch_one_pserver_already_holds_is_a_duplicate_to_the_trainer(
    nats_server: EmbeddedNats, tmp_path: Path, unique: str
) -> None:
    harness = one_shard_job(nats_server.url, f"dup-{unique}", tmp_path)
    try:
        harness.pserver(0).start()
        harness.pserver(1).start()
        coordinator = harness.coordinator().start()
        outcomes = await asyncio.to_thread(push_after_a_rollback, nats_server.url, harness.job)
        assert outcomes == ["duplicate", "applied"]
        assert await coordinator.wait(60) == 0, coordinator.tail()
        summary = coordinator.summary()
        assert summary["batches_applied"] == [2, 2]
        assert summary["duplicates_refused"] == [1, 0]
    finally:
        await harness.stop_all()
        harness.kill_all()


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as answer:
            return answer.status, answer.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()
    except OSError as error:  # not listening yet
        return 0, str(error)


async def test_the_example_trainer_serves_health_while_it_waits_for_its_coordinator(
    nats_server: EmbeddedNats, tmp_path: Path, unique: str
) -> None:
    port = free_port()
    harness = JobHarness(nats_server.url, f"health-{unique}", tmp_path)
    harness.trainer_args = ["--health-port", str(port), "--health-host", "127.0.0.1"]
    trainer = harness.trainer("t-health").start()
    base = f"http://127.0.0.1:{port}"
    try:

        async def alive() -> bool:
            return (await asyncio.to_thread(get, f"{base}/healthz"))[0] == 200

        await wait_until(alive, timeout=60, what="the trainer's /healthz")

        async def says_it_waits() -> bool:
            return "waiting for its coordinator" in trainer.stderr_path.read_text()

        await wait_until(says_it_waits, timeout=90, what="the trainer's waiting message")
        status, text = await asyncio.to_thread(get, f"{base}/readyz")
        assert (status, text) == (503, "not ready: waiting for the job spec\n")
        status, text = await asyncio.to_thread(get, f"{base}/metrics")
        assert status == 200 and "tideshift_trainer_batches_total" in text
        trainer.signal(signal.SIGTERM)
        assert await trainer.wait(30) == 0, trainer.tail()
    finally:
        harness.kill_all()


BATCHES = 10


def train_through_a_rollback(harness: JobHarness, url: str, metrics: str) -> list[str]:
    """A user's loop over a one-shard, two-epoch job. After 5 applied batches, pserver 1 is
    SIGKILLed (its only checkpoint is the initial one) and restarted; at the first batch of
    epoch 1, epoch 0 is applied everywhere, so the coordinator's /metrics must show the 5
    batches pserver 1 trained again. Returns every push result."""
    pserver = harness.pserver(1)
    with ElasticJob.connect(
        harness.job, nats_url=url, trainer="t-roll", handle_sigterm=False
    ) as job:
        job.initialize({"w": np.zeros(4, dtype=np.float32), "b": np.zeros(2)})

        async def recorded() -> bool:
            jobs = await job.bus.kv(TRAINER_JOBS_BUCKET)
            progress = await jobs.get(progress_key(harness.job, 1), PServerProgress)
            return progress is not None and progress.applied == 5

        def retrained_shown() -> bool:
            text = get(metrics)[1]
            return 'kind="retrained",pserver="1"} 5.0' in text.replace(
                'job="' + harness.job + '",', ""
            )

        outcomes: list[str] = []
        for task in job.tasks():
            for _ in task.batches(lambda location: list(range(BATCHES))):
                if outcomes.count("applied") == 5 and pserver.starts == 1:
                    job._loop.run(wait_until(recorded, timeout=30, what="pserver 1's progress"))
                    assert pserver.popen is not None
                    pserver.popen.kill()
                    pserver.popen.wait(10)
                    pserver.start()
                if task.epoch == 1 and "metrics checked" not in outcomes:

                    async def shown() -> bool:
                        return await asyncio.to_thread(retrained_shown)

                    job._loop.run(wait_until(shown, timeout=30, what="retrained on /metrics"))
                    outcomes.append("metrics checked")
                gradient = {"w": np.ones(4, dtype=np.float32), "b": np.ones(2)}
                outcomes.append(task.push(gradient, samples=1))
        return outcomes


async def test_a_rolled_back_pserver_counts_what_it_trains_again_and_exactly_once_holds(
    nats_server: EmbeddedNats, tmp_path: Path, unique: str
) -> None:
    port = free_port()
    harness = JobHarness(
        nats_server.url,
        f"rollback-{unique}",
        tmp_path,
        coordinator_args=[
            "--epochs", "2", "--dataset", json.dumps(["only-shard"]), "--pservers", "2",
            "--optimizer", json.dumps({"kind": "sgd", "learning_rate": 0.1}),
            "--health-port", str(port), "--health-host", "127.0.0.1",
        ],
        pserver_args=["--checkpoint-seconds", "3600"],
    )  # fmt: skip
    try:
        harness.pserver(0).start()
        harness.pserver(1).start()
        coordinator = harness.coordinator().start()
        outcomes = await asyncio.to_thread(
            train_through_a_rollback, harness, nats_server.url, f"http://127.0.0.1:{port}/metrics"
        )
        assert "metrics checked" in outcomes
        assert await coordinator.wait(60) == 0, coordinator.tail()
        restarted = harness.pserver(1).stderr_path.read_text()
        assert "restored 0 applied batches" in restarted
        assert "5 applied after this checkpoint were lost" in restarted
        # The user's exactly-once check, on the summary's documented fields only: every
        # pserver applied each of the 2 x 10 batches once, whatever it lost and redid.
        summary = coordinator.summary()
        assert summary["batches_applied"] == [2 * BATCHES, 2 * BATCHES]
        assert summary["retrained"] == [0, 5]
        # Each batch redone on pserver 1 was pushed to pserver 0 too, which refused it.
        assert summary["duplicates_refused"][0] >= 5, summary
        # To the trainer those pushes were not "applied": counting "applied" results would
        # not add up to the batches, which is why the check is on the pservers' counts.
        assert outcomes.count("applied") < 2 * BATCHES <= outcomes.count("applied") + 5 + 1
    finally:
        await harness.stop_all()
        harness.kill_all()


STANDBY_TRAINER = """
import logging
import numpy as np
from tideshift.services.trainer.sdk import ElasticJob

logging.basicConfig(level=logging.INFO)

with ElasticJob.connect() as job:  # TIDESHIFT_STANDBY=1: joins on SIGUSR1
    job.initialize({"w": np.zeros(4, dtype=np.float32), "b": np.zeros(2)})
    print("initialised", flush=True)
    for task in job.tasks():
        for _ in task.batches(lambda location: [0, 1]):
            gradient = {"w": np.ones(4, dtype=np.float32), "b": np.ones(2)}
            print(task.push(gradient, samples=1), flush=True)
"""


async def test_a_warm_standby_trainer_takes_no_work_until_sigusr1_then_joins(
    nats_server: EmbeddedNats, tmp_path: Path, unique: str
) -> None:
    """A standby connects and initialises but is no member and takes no task; SIGUSR1 joins
    it and it trains the job to the end; a SIGTERMed standby exits 0 without joining."""
    script = tmp_path / "standby_trainer.py"
    script.write_text(STANDBY_TRAINER)
    harness = one_shard_job(nats_server.url, f"warm-{unique}", tmp_path)
    try:
        harness.pserver(0).start()
        harness.pserver(1).start()
        coordinator = harness.coordinator().start()
        warm, idle = (harness.script(name, script, []) for name in ("t-warm", "t-idle"))
        for trainer in (warm, idle):
            trainer.env["TIDESHIFT_STANDBY"] = "1"
            trainer.start()

        async def standing_by() -> bool:
            return all(
                "initialised" in t.stdout() and "standing by" in t.stderr_path.read_text()
                for t in (warm, idle)
            )

        await wait_until(standing_by, timeout=90, what="both standbys ready")
        status = await asyncio.to_thread(training, nats_server.url, "status", "--job", harness.job)
        seen = json.loads(status.stdout)
        assert seen["trainers"] == [] and seen["shards_applied_in_epoch"] == 0, seen
        assert [p["batches_applied"] for p in seen["pservers"]] == [0, 0]
        idle.signal(signal.SIGTERM)
        assert await idle.wait(30) == 0, idle.tail()
        warm.signal(signal.SIGUSR1)
        assert await coordinator.wait(60) == 0, coordinator.tail()
        assert await warm.wait(30) == 0, warm.tail()
        assert warm.stdout().split() == ["initialised", "applied", "applied"]
        assert "joined" in warm.stderr_path.read_text()
        assert "joined" not in idle.stderr_path.read_text()
    finally:
        await harness.stop_all()
        harness.kill_all()
