"""The SDK used in-process, as a user's script would: a 50 MB model over two pservers, dense
and sparse gradients, chunked transparently below the NATS message limit."""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import pytest
from trainer_harness import one_shard_job

from tideshift.services.common.embedded_nats import EmbeddedNats
from tideshift.services.trainer.core.layout import LayoutError
from tideshift.services.trainer.sdk import ElasticJob

pytestmark = pytest.mark.timeout(300)


def big_model() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(3)
    return {
        "table": rng.normal(size=(100_000, 128)).astype(np.float32),  # 51.2 MB
        "bias": np.zeros(3, dtype=np.float64),
    }


def train_one_batch(url: str, job_name: str) -> dict[str, object]:
    with ElasticJob.connect(job_name, nats_url=url, trainer="sdk", handle_sigterm=False) as job:
        model = big_model()
        job.initialize(model)
        pulled = job.pull()
        outcomes = []
        for task in job.tasks():
            for batch in task.batches(lambda location: [location]):
                assert batch == "only-shard"
                rows = np.full((2, 128), 2.0, dtype=np.float32)
                gradients = {
                    "table": (np.array([5, 99_999]), rows),
                    "bias": np.array([1.0, 0.0, -1.0]),
                }
                outcomes.append(task.push(gradients, samples=10))
        with pytest.raises(LayoutError, match="'bias'"):
            job.initialize({**model, "bias": np.zeros(4)})
        return {"model": model, "pulled": pulled, "after": job.pull(), "outcomes": outcomes}


async def test_a_50_mb_model_initialises_pulls_and_takes_sparse_and_dense_gradients(
    nats_server: EmbeddedNats, tmp_path: Path, unique: str
) -> None:
    harness = one_shard_job(nats_server.url, f"big-{unique}", tmp_path)
    try:
        harness.pserver(0).start()
        harness.pserver(1).start()
        coordinator = harness.coordinator().start()
        result = await asyncio.to_thread(train_one_batch, nats_server.url, harness.job)
        assert await coordinator.wait(60) == 0, coordinator.tail()
        model, pulled, after = result["model"], result["pulled"], result["after"]
        assert isinstance(model, dict) and isinstance(pulled, dict) and isinstance(after, dict)
        assert pulled["table"].dtype == np.float32
        assert np.array_equal(pulled["table"], model["table"])
        assert result["outcomes"] == ["applied"]
        expected = model["table"].copy()
        expected[[5, 99_999]] -= 1.0  # SGD at 0.5 on the two touched rows only
        assert np.array_equal(after["table"], expected)
        assert np.allclose(after["bias"], [-0.5, 0.0, 0.5])
        assert coordinator.summary()["batches_applied"] == [1, 1]
    finally:
        await harness.stop_all()
        harness.kill_all()
