"""The example model: data determinism, shard URIs, convergence to the ground truth."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from tideshift.services.trainer.core.model import (
    HOLDOUT,
    DatasetSpec,
    InvalidShard,
    ModelSpec,
    ShardData,
    dataset_uris,
    generate_holdout,
    generate_shard,
    gradients,
    ground_truth,
    initial_state,
    log_loss,
    parse_uri,
    read_uri,
    shard_uri,
    train_serially,
    validate_shard,
)

SMALL = DatasetSpec(seed=3, num_shards=16, samples_per_shard=2000, holdout_samples=10000)


def test_shards_are_deterministic_and_distinct() -> None:
    first = generate_shard(SMALL, 5)
    again = generate_shard(SMALL, 5)
    other = generate_shard(SMALL, 6)
    assert np.array_equal(first.buckets, again.buckets)
    assert np.array_equal(first.clicks, again.clicks)
    assert not np.array_equal(first.buckets, other.buckets)
    validate_shard(first, SMALL.model)


def test_other_seed_gives_other_data() -> None:
    a = generate_shard(SMALL, 0)
    b = generate_shard(dataclasses.replace(SMALL, seed=4), 0)
    assert not np.array_equal(a.buckets, b.buckets)


def test_serial_training_converges_near_ground_truth() -> None:
    holdout = generate_holdout(SMALL)
    truth_loss = log_loss(ground_truth(SMALL), holdout)
    untrained = log_loss(initial_state(SMALL.model), holdout)
    learned = log_loss(train_serially(SMALL, epochs=4, learning_rate=0.3), holdout)
    assert learned < untrained - 0.2
    assert truth_loss <= learned < truth_loss + 0.03


def test_a_shard_uri_regenerates_the_same_shard_anywhere() -> None:
    uris = dataset_uris(SMALL)
    assert len(uris) == SMALL.num_shards
    assert parse_uri(uris[5]) == (SMALL, 5)
    assert np.array_equal(read_uri(uris[5]).buckets, generate_shard(SMALL, 5).buckets)
    holdout = read_uri(shard_uri(SMALL, HOLDOUT))
    assert holdout.num_samples == SMALL.holdout_samples


@pytest.mark.parametrize(
    ("uri", "reason"),
    [
        ("file:///tmp/x", "expected a clicks:// URI"),
        ("clicks://log?seed=1", "missing parameter 'shards'"),
        (shard_uri(SMALL, 0) + "&colour=red", "unknown parameters"),
        (shard_uri(SMALL, 99), "shard must be in"),
    ],
)
def test_a_bad_shard_uri_is_named(uri: str, reason: str) -> None:
    with pytest.raises(ValueError, match=reason):
        parse_uri(uri)


def test_sparse_gradient_matches_finite_differences() -> None:
    spec = DatasetSpec(
        seed=1, num_shards=1, samples_per_shard=50, model=ModelSpec(num_buckets=16, num_fields=3)
    )
    shard = generate_shard(spec, 0)
    rng = np.random.default_rng(0)
    params = {"weights": rng.normal(size=16), "bias": np.array(0.3)}
    grads = gradients(params, shard, l2=0.0)
    touched, rows = grads["weights"]
    dense = np.zeros(16)
    dense[touched] = rows
    assert set(touched) == set(np.unique(shard.buckets))
    for key in (0, 7, 15):
        bump = np.zeros(16)
        bump[key] = 1e-6
        up = log_loss({**params, "weights": params["weights"] + bump}, shard)
        down = log_loss({**params, "weights": params["weights"] - bump}, shard)
        assert dense[key] == pytest.approx((up - down) / 2e-6, rel=1e-4, abs=1e-7)
    up = log_loss({**params, "bias": params["bias"] + 1e-6}, shard)
    down = log_loss({**params, "bias": params["bias"] - 1e-6}, shard)
    assert float(grads["bias"]) == pytest.approx((up - down) / 2e-6, rel=1e-4)


@pytest.mark.parametrize(
    ("buckets", "clicks", "reason"),
    [
        (np.zeros((4, 7), dtype=np.int64), np.zeros(4), "buckets: expected shape"),
        (np.zeros((4, 8), dtype=np.int64), np.zeros(3), "clicks: expected shape"),
        (np.full((4, 8), 2048, dtype=np.int64), np.zeros(4), r"values must be in \[0, 2048\)"),
        (np.zeros((4, 8), dtype=np.int64), np.full(4, 0.5), "clicks: values must be 0 or 1"),
        (np.zeros((0, 8), dtype=np.int64), np.zeros(0), "no samples"),
    ],
)
def test_invalid_shard_rejected(buckets: np.ndarray, clicks: np.ndarray, reason: str) -> None:
    with pytest.raises(InvalidShard, match=reason):
        validate_shard(ShardData(buckets=buckets, clicks=clicks), ModelSpec())


@pytest.mark.parametrize("kwargs", [{"num_buckets": 0}, {"l2": -1.0}, {"l2": float("nan")}])
def test_model_spec_validates(kwargs: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        ModelSpec(**kwargs)  # type: ignore[arg-type]
