"""The PaddlePaddle examples train for real: user scripts on the SDK, real pservers and
coordinator processes, a real nats-server. Small jobs (seconds of compute)."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

import numpy as np
import pytest
from trainer_harness import REPO, JobHarness, client_of

from tideshift.services.common.bus import Bus
from tideshift.services.common.embedded_nats import EmbeddedNats
from tideshift.services.trainer.core.model import (
    HOLDOUT,
    DatasetSpec,
    ModelSpec,
    dataset_uris,
    ground_truth,
    log_loss,
    log_loss_of,
    read_uri,
    shard_uri,
)
from tideshift.services.trainer.training_cli import export_model

paddle = pytest.importorskip("paddle")
pytestmark = [pytest.mark.timeout(300), pytest.mark.slow]
EXAMPLES = REPO / "examples" / "training"
sys.path[:0] = [str(EXAMPLES / "paddle_ctr"), str(EXAMPLES / "paddle_mlp")]

import ctr  # noqa: E402
import mlp  # noqa: E402

CTR_DATA = DatasetSpec(
    seed=7,
    num_shards=24,
    samples_per_shard=2000,
    holdout_samples=5000,
    batch_size=500,
    model=ModelSpec(num_buckets=1024),
)


async def test_paddle_ctr_trains_to_near_the_ground_truth(
    bus: Bus, nats_server: EmbeddedNats, tmp_path: Path, unique: str
) -> None:
    epochs = 2
    harness = JobHarness(
        nats_server.url,
        f"ctr-{unique}",
        tmp_path,
        coordinator_args=[
            "--epochs",
            str(epochs),
            "--dataset",
            json.dumps(dataset_uris(CTR_DATA)),
            "--pservers",
            "2",
            "--optimizer",
            '{"kind": "adagrad", "learning_rate": 0.1}',
        ],
    )
    try:
        harness.pserver(0).start()
        harness.pserver(1).start()
        trainers = [harness.script(f"t{i}", EXAMPLES / "paddle_ctr" / "ctr.py", []).start()
                    for i in range(2)]  # fmt: skip
        coordinator = harness.coordinator().start()
        assert await coordinator.wait(240) == 0, coordinator.tail()
        batches = epochs * CTR_DATA.num_shards * 4
        assert coordinator.summary()["batches_applied"] == [batches, batches]
        for trainer in trainers:
            assert await trainer.wait(60) == 0, trainer.tail()
        client = await client_of(bus, harness.job)
        net = ctr.build(shard_uri(CTR_DATA, 0))
        holdout = read_uri(shard_uri(CTR_DATA, HOLDOUT))
        untrained = log_loss_of(ctr.probabilities(net, holdout), holdout.clicks)
        ctr.PaddleModel(net).load(await client.pull())
        trained = log_loss_of(ctr.probabilities(net, holdout), holdout.clicks)
        truth = log_loss(ground_truth(CTR_DATA), holdout)
        assert trained < untrained - 0.1
        assert truth <= trained <= truth * 1.05
    finally:
        await harness.stop_all()
        harness.kill_all()


async def test_paddle_mlp_classifier_learns_the_classes(
    bus: Bus, nats_server: EmbeddedNats, tmp_path: Path, unique: str
) -> None:
    mlp.prepare(tmp_path / "blobs", shards=6, samples=1000)
    harness = JobHarness(
        nats_server.url,
        f"mlp-{unique}",
        tmp_path,
        coordinator_args=[
            "--epochs",
            "3",
            "--dataset",
            str(tmp_path / "blobs" / "train"),
            "--optimizer",
            '{"kind": "adam", "learning_rate": 0.005}',
        ],
    )
    try:
        harness.pserver().start()
        trainers = [
            harness.script(f"t{i}", EXAMPLES / "paddle_mlp" / "mlp.py", ["train"]).start()
            for i in range(2)
        ]
        coordinator = harness.coordinator().start()
        assert await coordinator.wait(240) == 0, coordinator.tail()
        for trainer in trainers:
            assert await trainer.wait(60) == 0, trainer.tail()
        with np.load(tmp_path / "blobs" / "holdout.npz") as holdout:
            features, labels = holdout["features"], holdout["labels"]
        net = mlp.build()
        untrained_loss, _ = mlp.evaluate(net, features, labels)
        # Out as a user takes it: the SDK's export to .npz, then Layer.set_state_dict.
        exported = tmp_path / "model.npz"
        await asyncio.to_thread(export_model, harness.job, nats_server.url, exported)
        mlp.load_exported(net, exported)
        loss, accuracy = mlp.evaluate(net, features, labels)
        assert loss < untrained_loss / 2
        assert accuracy > 0.8
    finally:
        await harness.stop_all()
        harness.kill_all()
