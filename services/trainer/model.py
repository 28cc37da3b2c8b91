"""Click-through-rate model maths: a logistic regression over hashed sparse features.

Everything here is a pure function of its arguments (numpy only): the synthetic click log,
the gradient of one shard, the Adagrad update a parameter server applies, the held-out
log-loss and the split of the parameter vector into key ranges, one per parameter server.

Parameter layout: one flat float64 vector of ``num_buckets + 1`` entries, the hashed-feature
weights first and the bias last, so a key range is just ``[start, stop)`` over that vector.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

FloatArray = npt.NDArray[np.float64]
IndexArray = npt.NDArray[np.int64]

# Multiplicative hashing constants (odd 32-bit golden-ratio style mixers); any fixed odd
# constants would do, they only have to be the same for every process.
_FIELD_MIX = np.uint64(0x9E3779B1)
_VALUE_MIX = np.uint64(0x85EBCA77)
_FINAL_MIX = np.uint64(0xC2B2AE3D)
_HOLDOUT_STREAM = 2**31 - 1
_TRUTH_STREAM = 2**31 - 2


class InvalidShard(ValueError):
    """A shard's arrays do not fit the model (shape, dtype, index range, label values)."""


class GradientRejected(ValueError):
    """A gradient that must not touch the parameters; the message says why."""


@dataclass(frozen=True)
class ModelSpec:
    """Shape and optimiser of the model; every process of a job must agree on it."""

    num_buckets: int = 2048  # size of the hashed feature space
    num_fields: int = 8  # categorical fields per impression (site, ad, device, ...)
    learning_rate: float = 0.3  # Adagrad base step
    l2: float = 1e-4  # L2 penalty on the weights (not the bias), per sample-mean loss

    def __post_init__(self) -> None:
        if self.num_buckets < 1:
            raise ValueError(f"num_buckets must be >= 1, got {self.num_buckets}")
        if self.num_fields < 1:
            raise ValueError(f"num_fields must be >= 1, got {self.num_fields}")
        if not (self.learning_rate > 0 and np.isfinite(self.learning_rate)):
            raise ValueError(f"learning_rate must be a positive number, got {self.learning_rate}")
        if not (self.l2 >= 0 and np.isfinite(self.l2)):
            raise ValueError(f"l2 must be >= 0, got {self.l2}")

    @property
    def num_params(self) -> int:
        return self.num_buckets + 1


@dataclass(frozen=True)
class DatasetSpec:
    """A deterministic synthetic click log: same spec, same bytes, on every machine."""

    seed: int = 7
    num_shards: int = 32
    samples_per_shard: int = 2000
    holdout_samples: int = 20000
    field_cardinality: int = 200  # distinct raw values per field before hashing
    model: ModelSpec = ModelSpec()

    def __post_init__(self) -> None:
        for name in ("num_shards", "samples_per_shard", "holdout_samples", "field_cardinality"):
            value = getattr(self, name)
            if value < 1:
                raise ValueError(f"{name} must be >= 1, got {value}")
        if self.seed < 0:
            raise ValueError(f"seed must be >= 0, got {self.seed}")


@dataclass(frozen=True)
class ShardData:
    """Impressions of one shard: hashed bucket per field, and whether it was clicked."""

    buckets: IndexArray  # shape (samples, num_fields), values in [0, num_buckets)
    clicks: FloatArray  # shape (samples,), values 0.0 or 1.0

    @property
    def num_samples(self) -> int:
        return int(self.clicks.shape[0])


@dataclass(frozen=True)
class KeyRange:
    """The half-open slice ``[start, stop)`` of the parameter vector one pserver owns."""

    start: int
    stop: int

    @property
    def size(self) -> int:
        return self.stop - self.start


@dataclass(frozen=True)
class OptimizerState:
    """Parameters of one key range and their Adagrad accumulators."""

    key_range: KeyRange
    params: FloatArray
    squared_gradient_sum: FloatArray


# ---------------------------------------------------------------------------------------------
# Data


def hash_buckets(field_values: IndexArray, num_buckets: int) -> IndexArray:
    """Map raw (field, value) pairs to buckets; column j of ``field_values`` is field j."""
    values = field_values.astype(np.uint64)
    fields = np.arange(values.shape[1], dtype=np.uint64)[np.newaxis, :] + np.uint64(1)
    with np.errstate(over="ignore"):
        mixed = (fields * _FIELD_MIX) ^ (values * _VALUE_MIX)
        mixed = (mixed ^ (mixed >> np.uint64(15))) * _FINAL_MIX
        mixed ^= mixed >> np.uint64(13)
    buckets: IndexArray = (mixed % np.uint64(num_buckets)).astype(np.int64)
    return buckets


def ground_truth(spec: DatasetSpec) -> FloatArray:
    """The parameters that generated the clicks (same layout as the learned ones)."""
    rng = np.random.default_rng([spec.seed, _TRUTH_STREAM])
    truth = rng.normal(0.0, 0.7, size=spec.model.num_params)
    truth[-1] = -1.3  # bias: a click rate around 20 %, like a busy ad slot
    return truth


def _value_probabilities(cardinality: int) -> FloatArray:
    # Popular values dominate, as in real logs, but the tail is still seen often enough
    # that every bucket's weight is learnable from a few tens of thousands of impressions.
    weights: FloatArray = 1.0 / (np.arange(cardinality, dtype=np.float64) + 5.0)
    normalised: FloatArray = weights / weights.sum()
    return normalised


def _generate(spec: DatasetSpec, stream: int, samples: int) -> ShardData:
    rng = np.random.default_rng([spec.seed, stream])
    probabilities = _value_probabilities(spec.field_cardinality)
    raw = rng.choice(
        spec.field_cardinality, size=(samples, spec.model.num_fields), p=probabilities
    ).astype(np.int64)
    buckets = hash_buckets(raw, spec.model.num_buckets)
    truth = ground_truth(spec)
    probability = predict_proba(truth, buckets)
    clicks = (rng.random(samples) < probability).astype(np.float64)
    return ShardData(buckets=buckets, clicks=clicks)


def generate_shard(spec: DatasetSpec, shard: int) -> ShardData:
    """Shard ``shard`` of the training log; independent of which other shards exist."""
    if not 0 <= shard < spec.num_shards:
        raise ValueError(f"shard must be in [0, {spec.num_shards}), got {shard}")
    return _generate(spec, shard, spec.samples_per_shard)


def generate_holdout(spec: DatasetSpec) -> ShardData:
    """The held-out split, drawn from its own random stream."""
    return _generate(spec, _HOLDOUT_STREAM, spec.holdout_samples)


def validate_shard(shard: ShardData, model: ModelSpec) -> None:
    """Raise InvalidShard naming what does not fit the model."""
    buckets, clicks = shard.buckets, shard.clicks
    if buckets.ndim != 2 or buckets.shape[1] != model.num_fields:
        raise InvalidShard(
            f"buckets: expected shape (samples, {model.num_fields}), got {buckets.shape}"
        )
    if clicks.ndim != 1 or clicks.shape[0] != buckets.shape[0]:
        raise InvalidShard(f"clicks: expected shape ({buckets.shape[0]},), got {clicks.shape}")
    if buckets.shape[0] == 0:
        raise InvalidShard("shard has no samples")
    if not np.issubdtype(buckets.dtype, np.integer):
        raise InvalidShard(f"buckets: expected integers, got {buckets.dtype}")
    if buckets.min() < 0 or buckets.max() >= model.num_buckets:
        raise InvalidShard(
            f"buckets: values must be in [0, {model.num_buckets}), "
            f"got [{buckets.min()}, {buckets.max()}]"
        )
    if not np.all((clicks == 0.0) | (clicks == 1.0)):
        raise InvalidShard("clicks: values must be 0 or 1")


# ---------------------------------------------------------------------------------------------
# Model


def predict_proba(params: FloatArray, buckets: IndexArray) -> FloatArray:
    """Click probability of each impression."""
    logits = params[buckets].sum(axis=1) + params[-1]
    probability: FloatArray = 1.0 / (1.0 + np.exp(-np.clip(logits, -35.0, 35.0)))
    return probability


def log_loss(params: FloatArray, shard: ShardData) -> float:
    """Mean binary cross-entropy in nats."""
    probability = np.clip(predict_proba(params, shard.buckets), 1e-12, 1.0 - 1e-12)
    clicks = shard.clicks
    losses = -(clicks * np.log(probability) + (1.0 - clicks) * np.log(1.0 - probability))
    return float(losses.mean())


def compute_gradient(params: FloatArray, shard: ShardData, *, l2: float) -> FloatArray:
    """Gradient of the shard's mean log-loss (+ L2 on the weights) over the whole vector."""
    num_buckets = params.shape[0] - 1
    residual = predict_proba(params, shard.buckets) - shard.clicks
    per_field = np.repeat(residual, shard.buckets.shape[1])
    gradient = np.bincount(shard.buckets.ravel(), weights=per_field, minlength=num_buckets).astype(
        np.float64
    )
    gradient /= shard.num_samples
    gradient += l2 * params[:num_buckets]
    return np.append(gradient, residual.mean())


# ---------------------------------------------------------------------------------------------
# Parameter servers


def partition_keys(num_params: int, num_servers: int) -> tuple[KeyRange, ...]:
    """Split ``[0, num_params)`` into contiguous near-equal ranges, one per server."""
    if num_servers < 1:
        raise ValueError(f"num_servers must be >= 1, got {num_servers}")
    if num_params < num_servers:
        raise ValueError(f"cannot split {num_params} parameters over {num_servers} servers")
    base, extra = divmod(num_params, num_servers)
    ranges: list[KeyRange] = []
    start = 0
    for index in range(num_servers):
        stop = start + base + (1 if index < extra else 0)
        ranges.append(KeyRange(start, stop))
        start = stop
    return tuple(ranges)


def initial_state(key_range: KeyRange) -> OptimizerState:
    return OptimizerState(
        key_range=key_range,
        params=np.zeros(key_range.size, dtype=np.float64),
        squared_gradient_sum=np.zeros(key_range.size, dtype=np.float64),
    )


def validate_gradient(gradient: FloatArray, key_range: KeyRange) -> None:
    """Raise GradientRejected unless ``gradient`` is a finite vector of the range's size."""
    if gradient.ndim != 1 or gradient.shape[0] != key_range.size:
        raise GradientRejected(
            f"gradient: expected shape ({key_range.size},) for keys "
            f"[{key_range.start}, {key_range.stop}), got {gradient.shape}"
        )
    if not np.issubdtype(gradient.dtype, np.floating):
        raise GradientRejected(f"gradient: expected floats, got {gradient.dtype}")
    bad = np.flatnonzero(~np.isfinite(gradient))
    if bad.size:
        raise GradientRejected(
            f"gradient: {bad.size} non-finite values (first at key {key_range.start + bad[0]})"
        )


def apply_gradient(
    state: OptimizerState, gradient: FloatArray, *, learning_rate: float
) -> OptimizerState:
    """One Adagrad step; returns a new state and never mutates ``state``.

    Adagrad because hashed sparse features appear at very different rates: a per-key step
    size lets rare buckets learn as fast as the bias without a hand-tuned schedule.
    """
    validate_gradient(gradient, state.key_range)
    squared = state.squared_gradient_sum + gradient * gradient
    step = learning_rate * gradient / (np.sqrt(squared) + 1e-8)
    return OptimizerState(
        key_range=state.key_range,
        params=state.params - step,
        squared_gradient_sum=squared,
    )


def train_serially(spec: DatasetSpec, *, epochs: int, num_servers: int = 1) -> FloatArray:
    """The undisturbed reference run: every shard of every epoch applied once, in order."""
    model = spec.model
    ranges = partition_keys(model.num_params, num_servers)
    states = [initial_state(key_range) for key_range in ranges]
    shards = [generate_shard(spec, index) for index in range(spec.num_shards)]
    for _ in range(epochs):
        for shard in shards:
            params = np.concatenate([state.params for state in states])
            gradient = compute_gradient(params, shard, l2=model.l2)
            states = [
                apply_gradient(
                    state,
                    gradient[state.key_range.start : state.key_range.stop],
                    learning_rate=model.learning_rate,
                )
                for state in states
            ]
    return np.concatenate([state.params for state in states])
