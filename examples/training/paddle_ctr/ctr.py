"""An elastic PaddlePaddle CTR trainer: sparse embeddings per hashed field plus a small MLP
(wide and deep), trained on Tideshift's seeded synthetic click log.

Run one process per trainer (the job's coordinator and pservers must be up):

    TIDESHIFT_NATS_URL=nats://127.0.0.1:4222 TIDESHIFT_JOB=ctr python ctr.py

The job's dataset is a list of `clicks://` shard URIs (see README.md); each names the seed,
the shard and the batch size, so a trainer regenerates its shard and no files are shared.
"""

from __future__ import annotations

import argparse
import logging

import numpy as np
import paddle

from tideshift.services.trainer.core.model import ShardData, parse_uri, read_uri
from tideshift.services.trainer.sdk import ElasticJob
from tideshift.services.trainer.sdk.paddle_adapter import PaddleModel


class WideAndDeep(paddle.nn.Layer):
    """Logit = sum of one learned weight per hashed bucket (wide) + an MLP over the fields'
    embeddings (deep). Both tables are sparse: a batch updates only the rows it saw."""

    def __init__(self, num_buckets: int, num_fields: int, dim: int = 8, hidden: int = 32) -> None:
        super().__init__()
        self.num_fields, self.dim = num_fields, dim
        self.wide = paddle.nn.Embedding(num_buckets, 1, sparse=True)
        self.embedding = paddle.nn.Embedding(num_buckets, dim, sparse=True)
        self.deep = paddle.nn.Sequential(
            paddle.nn.Linear(num_fields * dim, hidden),
            paddle.nn.ReLU(),
            paddle.nn.Linear(hidden, 1),
        )
        paddle.nn.initializer.Constant(0.0)(self.wide.weight)

    def forward(self, buckets: paddle.Tensor) -> paddle.Tensor:
        wide = self.wide(buckets).sum(axis=[1, 2])
        deep = self.deep(self.embedding(buckets).reshape([-1, self.num_fields * self.dim]))
        return wide + deep.squeeze(-1)


def build(location: str, seed: int = 0) -> WideAndDeep:
    """The model for the job whose shards look like `location`, seeded so every trainer
    offers the same initial parameters."""
    spec, _ = parse_uri(location)
    paddle.seed(seed)
    return WideAndDeep(spec.model.num_buckets, spec.model.num_fields)


def read_shard(location: str) -> list[ShardData]:
    spec, _ = parse_uri(location)
    return read_uri(location).batches(spec.batch_size)


def loss_of(net: WideAndDeep, batch: ShardData) -> paddle.Tensor:
    logits = net(paddle.to_tensor(batch.buckets))
    labels = paddle.to_tensor(batch.clicks.astype(np.float32))
    return paddle.nn.functional.binary_cross_entropy_with_logits(logits, labels)


def probabilities(net: WideAndDeep, shard: ShardData) -> np.ndarray:
    with paddle.no_grad():
        return np.asarray(paddle.nn.functional.sigmoid(net(paddle.to_tensor(shard.buckets))))


def train(job: ElasticJob) -> None:
    net = build(job.spec.shards[0])
    model = PaddleModel(net)
    job.initialize(model.state())
    for task in job.tasks():
        for batch in task.batches(read_shard):
            model.load(task.pull())
            loss_of(net, batch).backward()
            task.push(model.gradients(), samples=batch.num_samples)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--job", help="job name (default: $TIDESHIFT_JOB)")
    parser.add_argument("--grace-seconds", type=float, default=10.0)
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    with ElasticJob.connect(args.job, grace_seconds=args.grace_seconds) as job:
        train(job)


if __name__ == "__main__":
    main()
