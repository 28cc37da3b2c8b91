"""Shard locations and service settings: what the trainer services refuse before the bus."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tideshift.services.trainer import worker
from tideshift.services.trainer.coordinator import service as coordinator
from tideshift.services.trainer.coordinator.dataset import resolve_shards
from tideshift.services.trainer.core.jobspec import JobSpec
from tideshift.services.trainer.pserver import service as pserver


def test_a_directory_a_glob_a_uri_and_a_list_name_shards_in_order(tmp_path: Path) -> None:
    for name in ("part-2.csv", "part-10.csv", "part-1.csv", ".hidden"):
        (tmp_path / name).write_text("x")
    (tmp_path / "sub").mkdir()
    files = [str(tmp_path / n) for n in ("part-1.csv", "part-10.csv", "part-2.csv")]
    assert resolve_shards(str(tmp_path)) == tuple(files)
    assert resolve_shards(str(tmp_path / "part-1*.csv")) == tuple(files[:2])
    assert resolve_shards("s3://bucket/a.parquet") == ("s3://bucket/a.parquet",)
    assert resolve_shards(json.dumps(["b", "a"])) == ("b", "a")


@pytest.mark.parametrize(
    ("dataset", "reason"),
    [
        ("", "empty"),
        ("[1, 2]", "non-empty strings"),
        ("[oops", "not a JSON list"),
        ("/no/such/dir", "no such directory"),
        ("/no/such/*.csv", "no shard found"),
    ],
)
def test_a_dataset_without_shards_is_refused_with_a_reason(dataset: str, reason: str) -> None:
    with pytest.raises(ValueError, match=reason):
        resolve_shards(dataset)


def test_job_spec_same_training_ignores_the_ack_wait() -> None:
    base = coordinator.CoordinatorSettings(job="ctr", dataset='["a", "b"]').job_spec()
    patient = base.model_copy(update={"ack_wait_seconds": 3.0})
    other = coordinator.CoordinatorSettings(
        job="ctr", dataset='["a", "b"]', optimizer={"kind": "adam"}
    ).job_spec()
    assert base.same_training(patient)
    assert not base.same_training(other)
    assert JobSpec.model_validate_json(base.model_dump_json()) == base


@pytest.mark.parametrize(
    ("main", "argv", "flag"),
    [
        (coordinator.main, ["--job", "ctr", "--dataset", "[]", "--epochs", "0"], "--epochs"),
        (coordinator.main, ["--dataset", "[]"], "--job"),
        (coordinator.main, ["--job", "ctr", "--dataset", "/no/such/dir"], "--dataset"),
        (
            coordinator.main,
            ["--job", "ctr", "--dataset", "a", "--optimizer", '{"kind": "lbfgs"}'],
            "--optimizer",
        ),
        (worker.main, ["--job", "ctr", "--grace-seconds", "60"], "--grace-seconds"),
        (pserver.main, ["--job", "ctr", "--index", "-1"], "--index"),
    ],
)
def test_invalid_flags_exit_2_naming_the_flag(
    main: object, argv: list[str], flag: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_info:
        code = main(argv)  # type: ignore[operator]
        raise SystemExit(code)
    assert exit_info.value.code == 2
    assert flag in capsys.readouterr().err
