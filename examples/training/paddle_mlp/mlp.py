"""An elastic PaddlePaddle MLP classifier on dense features: the SDK is not CTR-specific.

    python mlp.py prepare --out /data/blobs --shards 8     # seeded shards + holdout.npz
    tideshift run coordinator --job mlp --dataset /data/blobs/train --epochs 3 \
        --optimizer '{"kind": "adam", "learning_rate": 0.01}'
    tideshift run pserver --job mlp
    TIDESHIFT_NATS_URL=nats://127.0.0.1:4222 TIDESHIFT_JOB=mlp python mlp.py train
    tideshift training export --job mlp --out model.npz   # the trained model, from the pservers
    python mlp.py evaluate --model model.npz --holdout /data/blobs/holdout.npz

The data: four classes, each a Gaussian cloud around its own centre in 16 dimensions, with
overlap, so the best possible accuracy is below 100 % and a linear model is not enough.
Shards are .npz files in a directory; the job's dataset is that directory.
"""

from __future__ import annotations

import argparse
import logging
from pathlib import Path

import numpy as np
import paddle

from tideshift.services.trainer.sdk import ElasticJob
from tideshift.services.trainer.sdk.paddle_adapter import PaddleModel

FEATURES, CLASSES, BATCH = 16, 4, 200


def make_split(seed: int, stream: int, samples: int) -> tuple[np.ndarray, np.ndarray]:
    """Features and labels; the class centres depend on `seed` only, samples on `stream`."""
    centres = np.random.default_rng([seed, 0]).normal(0.0, 1.0, size=(CLASSES, FEATURES))
    rng = np.random.default_rng([seed, stream])
    labels = rng.integers(0, CLASSES, size=samples)
    # A square of the centre makes the classes curved: a linear model cannot separate them.
    features = centres[labels] + rng.normal(0.0, 1.0, size=(samples, FEATURES))
    features[:, 0] += centres[labels, 1] ** 2
    return features.astype(np.float32), labels.astype(np.int64)


def prepare(out: Path, *, shards: int, samples: int, seed: int = 11) -> None:
    (out / "train").mkdir(parents=True, exist_ok=True)
    for shard in range(shards):
        features, labels = make_split(seed, shard + 1, samples)
        np.savez(out / "train" / f"part-{shard:04d}.npz", features=features, labels=labels)
    features, labels = make_split(seed, 10**6, samples)
    np.savez(out / "holdout.npz", features=features, labels=labels)


def read_shard(location: str) -> list[tuple[np.ndarray, np.ndarray]]:
    with np.load(location) as shard:
        features, labels = shard["features"], shard["labels"]
    return [
        (features[start : start + BATCH], labels[start : start + BATCH])
        for start in range(0, len(labels), BATCH)
    ]


def build(seed: int = 0) -> paddle.nn.Layer:
    paddle.seed(seed)
    return paddle.nn.Sequential(
        paddle.nn.Linear(FEATURES, 64),
        paddle.nn.ReLU(),
        paddle.nn.Linear(64, 64),
        paddle.nn.ReLU(),
        paddle.nn.Linear(64, CLASSES),
    )


def evaluate(net: paddle.nn.Layer, features: np.ndarray, labels: np.ndarray) -> tuple[float, float]:
    """(mean cross-entropy, accuracy) on the given samples."""
    with paddle.no_grad():
        logits = net(paddle.to_tensor(features))
        loss = paddle.nn.functional.cross_entropy(logits, paddle.to_tensor(labels[:, None]))
        accuracy = float((np.asarray(logits).argmax(axis=1) == labels).mean())
    return float(loss), accuracy


def load_exported(net: paddle.nn.Layer, path: Path) -> None:
    """Load `tideshift training export`'s .npz: its names are the layer's parameter names."""
    with np.load(path) as exported:
        net.set_state_dict({name: paddle.to_tensor(exported[name]) for name in exported.files})


def train(job: ElasticJob) -> None:
    net = build()
    model = PaddleModel(net)
    job.initialize(model.state())
    for task in job.tasks():
        for features, labels in task.batches(read_shard):
            model.load(task.pull())
            logits = net(paddle.to_tensor(features))
            loss = paddle.nn.functional.cross_entropy(logits, paddle.to_tensor(labels[:, None]))
            loss.backward()
            task.push(model.gradients(), samples=len(labels))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    make = commands.add_parser("prepare", help="write the seeded shards and holdout")
    make.add_argument("--out", type=Path, required=True)
    make.add_argument("--shards", type=int, default=8)
    make.add_argument("--samples", type=int, default=2000, help="samples per shard")
    run = commands.add_parser("train", help="join the job as one elastic trainer")
    run.add_argument("--job", help="job name (default: $TIDESHIFT_JOB)")
    check = commands.add_parser("evaluate", help="loss and accuracy of an exported model")
    check.add_argument("--model", type=Path, required=True, help="from tideshift training export")
    check.add_argument("--holdout", type=Path, required=True, help="holdout.npz from prepare")
    args = parser.parse_args()
    if args.command == "prepare":
        prepare(args.out, shards=args.shards, samples=args.samples)
        return
    if args.command == "evaluate":
        net = build()
        load_exported(net, args.model)
        with np.load(args.holdout) as holdout:
            loss, accuracy = evaluate(net, holdout["features"], holdout["labels"])
        print(f"holdout loss {loss:.4f} accuracy {accuracy:.3f}")
        return
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    with ElasticJob.connect(args.job) as job:
        train(job)


if __name__ == "__main__":
    main()
