"""The built-in example model: a logistic regression over hashed click-log features, and
the seeded synthetic click log (with its known ground truth) every training example uses.

Everything here is a pure function of its arguments (numpy only). The model's parameters are
named arrays, `weights` (one per hashed bucket) and `bias` (a scalar), so it trains on the
elastic SDK like any user model; its gradient is sparse: a batch touches only the buckets it
saw. Shards are addressed by `clicks://` URIs, so a job's dataset is a list of locations and
any trainer can regenerate a shard bit-for-bit without shared files.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit

import numpy as np
import numpy.typing as npt

FloatArray = npt.NDArray[np.float64]
IndexArray = npt.NDArray[np.int64]
SparseRows = tuple[IndexArray, FloatArray]

# Multiplicative hashing constants (odd 32-bit golden-ratio style mixers); any fixed odd
# constants would do, they only have to be the same for every process.
_FIELD_MIX = np.uint64(0x9E3779B1)
_VALUE_MIX = np.uint64(0x85EBCA77)
_FINAL_MIX = np.uint64(0xC2B2AE3D)
_HOLDOUT_STREAM = 2**31 - 1
_TRUTH_STREAM = 2**31 - 2
URI_SCHEME = "clicks"
HOLDOUT = -1  # the shard number of the held-out split in a clicks:// URI


class InvalidShard(ValueError):
    """A shard's arrays do not fit the model (shape, dtype, index range, label values)."""


@dataclass(frozen=True)
class ModelSpec:
    """Shape of the model; every process of a job must agree on it."""

    num_buckets: int = 2048  # size of the hashed feature space
    num_fields: int = 8  # categorical fields per impression (site, ad, device, ...)
    l2: float = 1e-4  # L2 penalty on the weights (not the bias), per sample-mean loss

    def __post_init__(self) -> None:
        if self.num_buckets < 1:
            raise ValueError(f"num_buckets must be >= 1, got {self.num_buckets}")
        if self.num_fields < 1:
            raise ValueError(f"num_fields must be >= 1, got {self.num_fields}")
        if not (self.l2 >= 0 and np.isfinite(self.l2)):
            raise ValueError(f"l2 must be >= 0, got {self.l2}")


@dataclass(frozen=True)
class DatasetSpec:
    """A deterministic synthetic click log: same spec, same bytes, on every machine."""

    seed: int = 7
    num_shards: int = 32
    samples_per_shard: int = 2000
    holdout_samples: int = 20000
    field_cardinality: int = 200  # distinct raw values per field before hashing
    batch_size: int = 500  # impressions per training batch
    model: ModelSpec = ModelSpec()

    def __post_init__(self) -> None:
        for name in (
            "num_shards",
            "samples_per_shard",
            "holdout_samples",
            "field_cardinality",
            "batch_size",
        ):
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

    def batches(self, size: int) -> list[ShardData]:
        return [
            ShardData(self.buckets[start : start + size], self.clicks[start : start + size])
            for start in range(0, self.num_samples, size)
        ]


# ---------------------------------------------------------------------------------------------
# Shard locations


_URI_FIELDS = {
    "seed": "seed",
    "shards": "num_shards",
    "samples": "samples_per_shard",
    "holdout": "holdout_samples",
    "cardinality": "field_cardinality",
    "batch": "batch_size",
}


def shard_uri(spec: DatasetSpec, shard: int) -> str:
    """The location of `shard` (or HOLDOUT) of the synthetic log, as a clicks:// URI."""
    query = {key: getattr(spec, field) for key, field in _URI_FIELDS.items()}
    query |= {"buckets": spec.model.num_buckets, "fields": spec.model.num_fields}
    query |= {"l2": spec.model.l2, "shard": shard}
    return f"{URI_SCHEME}://log?{urlencode(query)}"


def dataset_uris(spec: DatasetSpec) -> list[str]:
    return [shard_uri(spec, shard) for shard in range(spec.num_shards)]


def parse_uri(uri: str) -> tuple[DatasetSpec, int]:
    """The dataset spec and shard number of a clicks:// URI; ValueError names the problem."""
    parts = urlsplit(uri)
    if parts.scheme != URI_SCHEME:
        raise ValueError(f"{uri!r}: expected a {URI_SCHEME}:// URI")
    query = dict(parse_qsl(parts.query, strict_parsing=True))
    try:
        values: dict[str, Any] = {field: int(query.pop(key)) for key, field in _URI_FIELDS.items()}
        model = ModelSpec(
            num_buckets=int(query.pop("buckets")),
            num_fields=int(query.pop("fields")),
            l2=float(query.pop("l2")),
        )
        shard = int(query.pop("shard"))
    except KeyError as error:
        raise ValueError(f"{uri!r}: missing parameter {error.args[0]!r}") from error
    if query:
        raise ValueError(f"{uri!r}: unknown parameters {sorted(query)}")
    spec = DatasetSpec(model=model, **values)
    if not (shard == HOLDOUT or 0 <= shard < spec.num_shards):
        raise ValueError(f"{uri!r}: shard must be in [0, {spec.num_shards}) or {HOLDOUT}")
    return spec, shard


def read_uri(uri: str) -> ShardData:
    spec, shard = parse_uri(uri)
    return generate_holdout(spec) if shard == HOLDOUT else generate_shard(spec, shard)


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


def ground_truth(spec: DatasetSpec) -> dict[str, FloatArray]:
    """The parameters that generated the clicks (same names as the learned ones)."""
    rng = np.random.default_rng([spec.seed, _TRUTH_STREAM])
    truth = rng.normal(0.0, 0.7, size=spec.model.num_buckets + 1)
    # bias: a click rate around 20 %, like a busy ad slot
    return {"weights": truth[:-1], "bias": np.array(-1.3)}


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
    probability = predict_proba(truth["weights"], float(truth["bias"]), buckets)
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


def predict_proba(weights: FloatArray, bias: float, buckets: IndexArray) -> FloatArray:
    """Click probability of each impression."""
    logits = weights[buckets].sum(axis=1) + bias
    probability: FloatArray = 1.0 / (1.0 + np.exp(-np.clip(logits, -35.0, 35.0)))
    return probability


def log_loss_of(probability: FloatArray, clicks: FloatArray) -> float:
    """Mean binary cross-entropy in nats of predicted click probabilities."""
    probability = np.clip(probability, 1e-12, 1.0 - 1e-12)
    losses = -(clicks * np.log(probability) + (1.0 - clicks) * np.log(1.0 - probability))
    return float(losses.mean())


def log_loss(params: dict[str, Any], shard: ShardData) -> float:
    """Mean binary cross-entropy in nats of the logistic regression `params`."""
    weights = np.asarray(params["weights"], dtype=np.float64)
    probability = predict_proba(weights, float(params["bias"]), shard.buckets)
    return log_loss_of(probability, shard.clicks)


# ---------------------------------------------------------------------------------------------
# Training


def initial_state(model: ModelSpec) -> dict[str, FloatArray]:
    return {"weights": np.zeros(model.num_buckets), "bias": np.zeros(())}


def sparse_gradient(
    weights: FloatArray, bias: float, shard: ShardData, *, l2: float
) -> tuple[IndexArray, FloatArray, float]:
    """(touched buckets, their weights' gradient, the bias gradient) of the batch's mean
    log-loss plus L2 on the touched weights."""
    residual = predict_proba(weights, bias, shard.buckets) - shard.clicks
    touched, inverse = np.unique(shard.buckets.ravel(), return_inverse=True)
    per_field = np.repeat(residual, shard.buckets.shape[1])
    rows = np.bincount(inverse, weights=per_field, minlength=touched.size) / shard.num_samples
    rows += l2 * weights[touched]
    return touched, rows, float(residual.mean())


def gradients(
    params: dict[str, Any], shard: ShardData, *, l2: float
) -> dict[str, SparseRows | FloatArray]:
    """The SDK's form: sparse rows of `weights` for the buckets the batch saw, and `bias`."""
    weights = np.asarray(params["weights"], dtype=np.float64)
    touched, rows, bias = sparse_gradient(weights, float(params["bias"]), shard, l2=l2)
    return {"weights": (touched, rows), "bias": np.array(bias)}


def train_serially(
    spec: DatasetSpec, *, epochs: int, learning_rate: float
) -> dict[str, FloatArray]:
    """The undisturbed reference: every batch of every epoch once, in order, with Adagrad
    (the example job's optimiser), without any pserver."""
    weights, bias = np.zeros(spec.model.num_buckets), 0.0
    weight_sum, bias_sum = np.zeros_like(weights), 0.0
    shards = [generate_shard(spec, index) for index in range(spec.num_shards)]
    for _ in range(epochs):
        for shard in shards:
            for batch in shard.batches(spec.batch_size):
                touched, rows, bias_gradient = sparse_gradient(
                    weights, bias, batch, l2=spec.model.l2
                )
                weight_sum[touched] += rows * rows
                weights[touched] -= learning_rate * rows / (np.sqrt(weight_sum[touched]) + 1e-8)
                bias_sum += bias_gradient**2
                bias -= learning_rate * bias_gradient / (np.sqrt(bias_sum) + 1e-8)
    return {"weights": weights, "bias": np.array(bias)}
