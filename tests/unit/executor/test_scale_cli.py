"""`tideshift scale` arguments: durations, --release, and clear errors naming the flag."""

from __future__ import annotations

from datetime import timedelta

import pytest

from tideshift.events import WorkloadRef
from tideshift.services.executor.scale_cli import main, parse_duration, pin_key


@pytest.mark.parametrize(
    ("text", "seconds"), [("90s", 90), ("30m", 1800), ("2h", 7200), ("1.5d", 129600)]
)
def test_durations(text: str, seconds: float) -> None:
    assert parse_duration(text) == timedelta(seconds=seconds)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["deploy/web", "--replicas", "3", "--for", "soon"], "--for: expected a duration > 0"),
        (["deploy/web", "--replicas", "3", "--for", "0m"], "--for: expected a duration > 0"),
        (["deploy/web"], "--replicas: required (or --release)"),
        (["deploy/web", "--release", "--replicas", "2"], "--release: takes no --replicas"),
        (["deploy/web", "--resume", "--replicas", "2"], "--resume: takes no --replicas"),
        (["deploy/web", "--resume", "--release"], "--resume: not with --release"),
        (["pod/web", "--replicas", "2"], "unknown kind 'pod'"),
    ],
)
def test_bad_arguments_name_the_flag(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        main(argv)
    assert exited.value.code == 2
    assert message in capsys.readouterr().err


def test_pins_are_keyed_by_the_whole_identity() -> None:
    volcano = WorkloadRef("ml", "Job.batch.volcano.sh", "ctr")
    batch = WorkloadRef("ml", "Job.batch", "ctr")
    assert pin_key(volcano) != pin_key(batch)
    assert "/" not in pin_key(volcano) and "*" not in pin_key(volcano)
