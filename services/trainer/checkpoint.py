"""Pserver checkpoints as bytes: parameters, Adagrad accumulators and the applied set together,
so a restore can never pair parameters with an applied set they do not reflect. Pure."""

from __future__ import annotations

import numpy as np

from tideshift.services.trainer.model import KeyRange, OptimizerState
from tideshift.services.trainer.protocol import PServerState
from tideshift.services.trainer.wire import WireError, header_int, header_str, pack, unpack

FORMAT_VERSION = 1


def encode_checkpoint(state: PServerState) -> bytes:
    keys = sorted(state.applied)
    applied = np.array(
        [(epoch, shard, state.applied[(epoch, shard)]) for epoch, shard in keys], dtype=np.int64
    ).reshape(len(keys), 3)
    optimizer = state.optimizer
    return pack(
        {
            "format": FORMAT_VERSION,
            "job": state.job,
            "version": state.version,
            "start": optimizer.key_range.start,
            "stop": optimizer.key_range.stop,
        },
        {
            "params": optimizer.params,
            "squared_gradient_sum": optimizer.squared_gradient_sum,
            "applied": applied,
        },
    )


def decode_checkpoint(payload: bytes, *, job: str, key_range: KeyRange) -> PServerState:
    """Restore a checkpoint; raises WireError if it is malformed or for another job/range."""
    header, arrays = unpack(payload)
    if header_int(header, "format") != FORMAT_VERSION:
        raise WireError(f"checkpoint format {header.get('format')} is not {FORMAT_VERSION}")
    if header_str(header, "job") != job:
        raise WireError(f"checkpoint is for job {header.get('job')!r}, not {job!r}")
    stored = KeyRange(header_int(header, "start"), header_int(header, "stop"))
    if stored != key_range:
        raise WireError(
            f"checkpoint covers keys [{stored.start}, {stored.stop}), "
            f"not [{key_range.start}, {key_range.stop})"
        )
    try:
        params, squared, applied = (
            arrays["params"],
            arrays["squared_gradient_sum"],
            arrays["applied"],
        )
    except KeyError as error:
        raise WireError(f"checkpoint: missing array {error.args[0]!r}") from error
    if params.shape != (key_range.size,) or squared.shape != (key_range.size,):
        raise WireError(f"checkpoint: parameter arrays must have shape ({key_range.size},)")
    if applied.ndim != 2 or applied.shape[1] != 3:
        raise WireError("checkpoint: applied must have shape (n, 3)")
    if not (np.all(np.isfinite(params)) and np.all(np.isfinite(squared))):
        raise WireError("checkpoint: non-finite parameters")
    return PServerState(
        job=job,
        optimizer=OptimizerState(
            key_range=key_range, params=params.copy(), squared_gradient_sum=squared.copy()
        ),
        applied={(int(e), int(s)): int(d) for e, s, d in applied},
        version=header_int(header, "version", minimum=0),
    )
