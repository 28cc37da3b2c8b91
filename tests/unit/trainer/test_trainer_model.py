"""Model maths: data determinism, convergence to the ground truth, key ranges, rejection."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from tideshift.services.trainer.model import (
    DatasetSpec,
    GradientRejected,
    InvalidShard,
    KeyRange,
    ModelSpec,
    ShardData,
    apply_gradient,
    compute_gradient,
    generate_holdout,
    generate_shard,
    ground_truth,
    initial_state,
    log_loss,
    partition_keys,
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
    untrained = log_loss(np.zeros(SMALL.model.num_params), holdout)
    learned = log_loss(train_serially(SMALL, epochs=4), holdout)
    assert learned < untrained - 0.2
    assert truth_loss <= learned < truth_loss + 0.03


def test_sharded_servers_train_exactly_like_one() -> None:
    one = train_serially(SMALL, epochs=1, num_servers=1)
    three = train_serially(SMALL, epochs=1, num_servers=3)
    assert np.allclose(one, three)


@pytest.mark.parametrize(
    ("num_params", "servers", "expected"),
    [
        (10, 1, [(0, 10)]),
        (10, 3, [(0, 4), (4, 7), (7, 10)]),
        (4, 4, [(0, 1), (1, 2), (2, 3), (3, 4)]),
    ],
)
def test_partition_keys_covers_every_key_once(
    num_params: int, servers: int, expected: list[tuple[int, int]]
) -> None:
    assert [(r.start, r.stop) for r in partition_keys(num_params, servers)] == expected


@pytest.mark.parametrize(("num_params", "servers"), [(3, 4), (10, 0)])
def test_partition_keys_rejects_impossible_splits(num_params: int, servers: int) -> None:
    with pytest.raises(ValueError):
        partition_keys(num_params, servers)


def test_gradient_matches_finite_differences() -> None:
    spec = DatasetSpec(
        seed=1, num_shards=1, samples_per_shard=50, model=ModelSpec(num_buckets=16, num_fields=3)
    )
    shard = generate_shard(spec, 0)
    rng = np.random.default_rng(0)
    params = rng.normal(size=spec.model.num_params)
    gradient = compute_gradient(params, shard, l2=0.0)
    for key in (0, 7, spec.model.num_params - 1):
        bump = np.zeros_like(params)
        bump[key] = 1e-6
        numeric = (log_loss(params + bump, shard) - log_loss(params - bump, shard)) / 2e-6
        assert gradient[key] == pytest.approx(numeric, rel=1e-4, abs=1e-7)


@pytest.mark.parametrize(
    ("gradient", "reason"),
    [
        (np.zeros(3), "expected shape (4,)"),
        (np.zeros((4, 1)), "expected shape (4,)"),
        (np.array([0.0, np.nan, 0.0, 0.0]), "non-finite values (first at key 11)"),
        (np.array([0.0, 0.0, np.inf, 0.0]), "non-finite"),
        (np.zeros(4, dtype=np.int64), "expected floats"),
    ],
)
def test_bad_gradient_rejected_and_state_untouched(gradient: np.ndarray, reason: str) -> None:
    state = initial_state(KeyRange(10, 14))
    before = state.params.copy()
    with pytest.raises(GradientRejected, match=reason.replace("(", r"\(").replace(")", r"\)")):
        apply_gradient(state, gradient, learning_rate=0.1)
    assert np.array_equal(state.params, before)


def test_apply_gradient_returns_new_state() -> None:
    state = initial_state(KeyRange(0, 3))
    after = apply_gradient(state, np.array([1.0, -1.0, 0.0]), learning_rate=0.5)
    assert np.allclose(after.params, [-0.5, 0.5, 0.0])
    assert np.array_equal(state.params, np.zeros(3))


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


@pytest.mark.parametrize(
    "kwargs", [{"num_buckets": 0}, {"learning_rate": 0.0}, {"learning_rate": float("nan")}]
)
def test_model_spec_validates(kwargs: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        ModelSpec(**kwargs)  # type: ignore[arg-type]
