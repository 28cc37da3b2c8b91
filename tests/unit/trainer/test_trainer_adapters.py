"""Framework adapters: a model's parameters and gradients as the SDK's named arrays."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tideshift.services.trainer.core.layout import check_state, describe, plan
from tideshift.services.trainer.port.pserver_client import piece_updates


def test_paddle_state_round_trips_and_embedding_gradients_are_sparse_rows() -> None:
    paddle = pytest.importorskip("paddle")
    from tideshift.services.trainer.sdk.paddle_adapter import PaddleModel

    paddle.seed(1)
    embedding = paddle.nn.Embedding(50, 4, sparse=True)
    head = paddle.nn.Linear(4, 1)
    net = paddle.nn.LayerDict({"embedding": embedding, "head": head})
    model = PaddleModel(net)
    state = model.state()
    assert {name: value.shape for name, value in state.items()} == {
        "embedding.weight": (50, 4), "head.weight": (4, 1), "head.bias": (1,),
    }  # fmt: skip
    check_state(plan(describe(state), 2), state)
    model.load({name: np.full_like(value, 0.5) for name, value in state.items()})
    assert np.all(model.state()["head.weight"] == 0.5)

    ids = paddle.to_tensor([[3, 7], [7, 9]], dtype="int64")
    head(embedding(ids).sum(axis=1)).sum().backward()
    gradients = model.gradients()
    indices, rows = gradients["embedding.weight"]
    assert sorted(set(indices.tolist())) == [3, 7, 9]
    assert rows.shape == (len(indices), 4)
    assert np.allclose(rows, 0.5)  # d(sum)/d(row) is the head's weight, 0.5 everywhere
    assert gradients["head.weight"].shape == (4, 1)
    assert embedding.weight.grad is None  # cleared for the next batch
    per_server = piece_updates(plan(describe(state), 1), gradients)
    assert sum(len(updates) for updates in per_server.values()) == 3


def test_torch_state_round_trips_and_embedding_gradients_are_sparse_rows() -> None:
    torch = pytest.importorskip("torch")  # not installed in CI: its wheel pulls GPU libraries
    from tideshift.services.trainer.sdk.torch_adapter import TorchModel

    embedding = torch.nn.Embedding(50, 4, sparse=True)
    head = torch.nn.Linear(4, 1)
    net = torch.nn.ModuleDict({"embedding": embedding, "head": head})
    model = TorchModel(net)
    state = model.state()
    model.load({name: np.full_like(value, 0.5) for name, value in state.items()})
    head(embedding(torch.tensor([[3, 7], [7, 9]])).sum(dim=1)).sum().backward()
    gradients = model.gradients()
    indices, rows = gradients["embedding.weight"]
    assert sorted(indices.tolist()) == [3, 7, 9]
    assert rows.shape == (3, 4)
    assert embedding.weight.grad is None


def test_the_ctr_example_manifest_scales_its_trainer_task() -> None:
    import yaml

    from tideshift.services.cluster.adapters.targets import VolcanoJobAdapter

    manifest = Path(__file__).resolve().parents[3] / "examples/training/paddle_ctr/job.yaml"
    job = yaml.safe_load(manifest.read_text())
    tasks = job["spec"]["tasks"]
    assert tasks[VolcanoJobAdapter.task_index(job)]["name"] == "trainer"
    for task in tasks:
        assert task["template"]["metadata"]["labels"]["tideshift.io/role"] == "training"
