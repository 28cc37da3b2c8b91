"""Shard files and service settings: what the trainer services refuse before touching the bus."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest

from tideshift.services.trainer import coordinator, pserver, worker
from tideshift.services.trainer.dataset import ensure_dataset, holdout_path, load_shard, shard_path
from tideshift.services.trainer.jobspec import JobSpec
from tideshift.services.trainer.model import DatasetSpec, InvalidShard, generate_shard

SPEC = DatasetSpec(seed=1, num_shards=3, samples_per_shard=100, holdout_samples=50)


def test_dataset_written_once_and_read_back(tmp_path: Path) -> None:
    assert ensure_dataset(SPEC, tmp_path) == 4  # 3 shards + holdout
    assert ensure_dataset(SPEC, tmp_path) == 0
    shard = load_shard(shard_path(tmp_path, 2), SPEC)
    assert np.array_equal(shard.buckets, generate_shard(SPEC, 2).buckets)
    assert load_shard(holdout_path(tmp_path), SPEC).num_samples == 50


def test_directory_of_another_spec_refused(tmp_path: Path) -> None:
    ensure_dataset(SPEC, tmp_path)
    with pytest.raises(ValueError, match="holds data generated with"):
        ensure_dataset(dataclasses.replace(SPEC, seed=2), tmp_path)


@pytest.mark.parametrize(
    ("content", "reason"),
    [(None, "no such shard file"), (b"not a zip", "unreadable shard")],
)
def test_unreadable_shard_named(tmp_path: Path, content: bytes | None, reason: str) -> None:
    path = tmp_path / "shard-00000.npz"
    if content is not None:
        path.write_bytes(content)
    with pytest.raises(InvalidShard, match=reason):
        load_shard(path, SPEC)


def test_shard_that_does_not_fit_the_model_refused(tmp_path: Path) -> None:
    path = tmp_path / "shard-00000.npz"
    np.savez(path, buckets=np.full((4, SPEC.model.num_fields), 10**6), clicks=np.zeros(4))
    with pytest.raises(InvalidShard, match=r"shard-00000.npz: buckets: values must be in"):
        load_shard(path, SPEC)


def test_job_spec_same_training_ignores_paths() -> None:
    base = coordinator.CoordinatorSettings(job="ctr").job_spec()
    moved = base.model_copy(update={"data_dir": "/elsewhere", "ack_wait_seconds": 3.0})
    other = base.model_copy(update={"seed": base.seed + 1})
    assert base.same_training(moved)
    assert not base.same_training(other)
    assert JobSpec.model_validate_json(base.model_dump_json()) == base


@pytest.mark.parametrize(
    ("main", "argv", "flag"),
    [
        (coordinator.main, ["--job", "ctr", "--epochs", "0"], "--epochs"),
        (coordinator.main, [], "--job"),
        (coordinator.main, ["--job", "ctr", "--pservers", "x"], "--pservers"),
        (worker.main, ["--job", "ctr", "--grace-seconds", "60"], "--grace-seconds"),
        (pserver.main, ["--job", "ctr", "--index", "-1"], "--index"),
    ],
)
def test_invalid_flags_exit_2_naming_the_flag(
    main: object, argv: list[str], flag: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(argv)  # type: ignore[operator]
    assert exit_info.value.code == 2
    assert flag in capsys.readouterr().err
