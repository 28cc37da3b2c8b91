"""`tideshift training reset|status|export` on a real job: a wrong first model that even
trained a batch is named, with the job's and the trainer's layouts and the reset command, to
the next trainer; the reset recovers the job while its coordinator and pservers keep running
(none restarted), the right model trains every batch once, and status and export show what
the pservers hold."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import numpy as np
import pytest
from trainer_harness import JobHarness, training

from tideshift.services.common.embedded_nats import EmbeddedNats
from tideshift.services.trainer.core.layout import LayoutError
from tideshift.services.trainer.sdk import ElasticJob

pytestmark = pytest.mark.timeout(300)


def model(width: int) -> dict[str, np.ndarray]:
    return {"w": np.zeros(width, dtype=np.float32), "b": np.zeros(2)}


def train(url: str, job_name: str, width: int, *, batches: int = 2) -> list[str]:
    """Initialise a model of `width` and train; stop (handing the shard back) after
    `batches` pushes."""
    with ElasticJob.connect(
        job_name, nats_url=url, trainer=f"w{width}", handle_sigterm=False
    ) as job:
        job.initialize(model(width))
        outcomes = []
        for task in job.tasks():
            for _ in task.batches(lambda location: [0, 1]):
                gradient = {"w": np.ones(width, dtype=np.float32), "b": np.ones(2)}
                outcomes.append(task.push(gradient, samples=1))
                if len(outcomes) == batches:
                    job.request_stop()
        return outcomes


async def test_a_wrong_first_layout_is_named_reset_and_the_right_model_trained_and_exported(
    nats_server: EmbeddedNats, tmp_path: Path, unique: str
) -> None:
    url = nats_server.url
    harness = JobHarness(
        url,
        f"reset-{unique}",
        tmp_path,
        coordinator_args=[
            "--epochs", "1", "--dataset", json.dumps(["only-shard"]), "--pservers", "2",
            "--optimizer", json.dumps({"kind": "sgd", "learning_rate": 0.5}),
        ],
    )  # fmt: skip
    job = harness.job
    services = [harness.pserver(0), harness.pserver(1), harness.coordinator()]
    try:
        for service in services:
            service.start()
        # The wrong model initialises the job and trains its first batch, then leaves.
        assert await asyncio.to_thread(train, url, job, 3, batches=1) == ["applied"]
        with pytest.raises(LayoutError) as mismatch:
            await asyncio.to_thread(train, url, job, 4)
        message = str(mismatch.value)
        assert "w (3,) float32" in message and "w (4,) float32" in message, message
        assert f"tideshift training reset --job {job}" in message

        reset = await asyncio.to_thread(training, url, "reset", "--job", job)
        assert reset.returncode == 0, reset.stderr
        outcomes = await asyncio.to_thread(train, url, job, 4, batches=3)
        assert outcomes.count("applied") == 2, outcomes
        coordinator = services[2]
        assert await coordinator.wait(60) == 0, coordinator.tail()
        assert [service.starts for service in services] == [1, 1, 1]  # nothing restarted
        assert "the job was reset; starting over" in coordinator.stderr_path.read_text()
        summary = coordinator.summary()
        assert summary["batches_applied"] == [2, 2], summary  # the wrong model's one is gone

        status = await asyncio.to_thread(training, url, "status", "--job", job)
        assert status.returncode == 0, status.stderr
        seen = json.loads(status.stdout)
        assert seen["finished"] is True and seen["model"] is True
        assert [p["batches_applied"] for p in seen["pservers"]] == [2, 2]

        out = tmp_path / "model.npz"
        export = await asyncio.to_thread(training, url, "export", "--job", job, "--out", str(out))
        assert export.returncode == 0, export.stderr
        with np.load(out) as exported:  # two SGD steps of 0.5 on gradients of ones
            assert np.array_equal(exported["w"], np.full(4, -1.0, dtype=np.float32))
            assert np.allclose(exported["b"], [-1.0, -1.0])
    finally:
        await harness.stop_all()
        harness.kill_all()


def test_status_of_an_unknown_job_is_one_line_naming_it(nats_server: EmbeddedNats) -> None:
    result = training(nats_server.url, "status", "--job", "no-such-job")
    assert result.returncode == 1
    # The last line: the bus still logs a WARNING when it closes (services/common/bus).
    assert result.stderr.strip().splitlines()[-1] == (
        "tideshift training status: job no-such-job: no job spec on the bus "
        "(has its coordinator run?)"
    )
