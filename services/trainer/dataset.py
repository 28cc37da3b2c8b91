"""Shard files in a shared directory: written once by the coordinator, read by every trainer.

Files are written to a temporary name and renamed, so a reader never sees half a shard; a
manifest records the spec that produced them, so a directory made for another spec is
refused instead of silently trained on.
"""

from __future__ import annotations

import json
import os
import tempfile
import zipfile
from pathlib import Path

import numpy as np

from tideshift.services.trainer.model import (
    DatasetSpec,
    InvalidShard,
    ShardData,
    generate_holdout,
    generate_shard,
    validate_shard,
)

MANIFEST = "manifest.json"


def default_data_dir(job: str) -> str:
    return str(Path(tempfile.gettempdir()) / "tideshift-data" / job)


def shard_path(data_dir: str | Path, shard: int) -> Path:
    return Path(data_dir) / f"shard-{shard:05d}.npz"


def holdout_path(data_dir: str | Path) -> Path:
    return Path(data_dir) / "holdout.npz"


def _manifest(spec: DatasetSpec) -> dict[str, object]:
    return {
        "seed": spec.seed,
        "num_shards": spec.num_shards,
        "samples_per_shard": spec.samples_per_shard,
        "holdout_samples": spec.holdout_samples,
        "field_cardinality": spec.field_cardinality,
        "num_buckets": spec.model.num_buckets,
        "num_fields": spec.model.num_fields,
    }


def _write_atomically(path: Path, shard: ShardData) -> None:
    temporary = path.with_suffix(f".tmp-{os.getpid()}.npz")
    np.savez(temporary, buckets=shard.buckets, clicks=shard.clicks)
    temporary.replace(path)


def ensure_dataset(spec: DatasetSpec, data_dir: str | Path) -> int:
    """Generate missing shard files; returns how many were written.

    Raises ValueError when the directory holds data of another spec.
    """
    directory = Path(data_dir)
    directory.mkdir(parents=True, exist_ok=True)
    manifest_file = directory / MANIFEST
    wanted = _manifest(spec)
    if manifest_file.exists():
        try:
            existing = json.loads(manifest_file.read_text())
        except json.JSONDecodeError as error:
            raise ValueError(f"{manifest_file}: not JSON ({error.msg})") from error
        if existing != wanted:
            raise ValueError(
                f"{directory} holds data generated with {existing}, not {wanted}; "
                "choose another --data-dir or delete it"
            )
    written = 0
    for index in range(spec.num_shards):
        path = shard_path(directory, index)
        if not path.exists():
            _write_atomically(path, generate_shard(spec, index))
            written += 1
    if not holdout_path(directory).exists():
        _write_atomically(holdout_path(directory), generate_holdout(spec))
        written += 1
    if not manifest_file.exists():
        temporary = manifest_file.with_suffix(f".tmp-{os.getpid()}")
        temporary.write_text(json.dumps(wanted, indent=2))
        temporary.replace(manifest_file)
    return written


def load_shard(path: Path, spec: DatasetSpec) -> ShardData:
    """Read and validate a shard file; raises InvalidShard naming the file and the problem."""
    try:
        with np.load(path, allow_pickle=False) as archive:
            shard = ShardData(
                buckets=np.asarray(archive["buckets"]), clicks=np.asarray(archive["clicks"])
            )
    except FileNotFoundError as error:
        raise InvalidShard(f"{path}: no such shard file") from error
    except (KeyError, ValueError, OSError, zipfile.BadZipFile) as error:
        raise InvalidShard(f"{path}: unreadable shard ({error})") from error
    try:
        validate_shard(shard, spec.model)
    except InvalidShard as error:
        raise InvalidShard(f"{path}: {error}") from error
    return shard
