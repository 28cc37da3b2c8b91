"""The executor's settings from flags and environment: booleans are plain flags, flags win."""

from __future__ import annotations

import pytest

from tideshift.services.common.settings import parse_settings
from tideshift.services.executor.service import ExecutorSettings

PROG = "tideshift run executor"


def test_dry_run_is_a_flag_without_a_value() -> None:
    assert parse_settings(ExecutorSettings, [], prog=PROG).dry_run is False
    assert parse_settings(ExecutorSettings, ["--dry-run"], prog=PROG).dry_run is True


def test_flags_win_over_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TIDESHIFT_DRY_RUN", "true")
    monkeypatch.setenv("TIDESHIFT_MAX_STEP", "3")
    from_env = parse_settings(ExecutorSettings, [], prog=PROG)
    assert (from_env.dry_run, from_env.max_step) == (True, 3)
    from_flags = parse_settings(ExecutorSettings, ["--no-dry-run", "--max-step", "7"], prog=PROG)
    assert (from_flags.dry_run, from_flags.max_step) == (False, 7)


def test_help_lists_each_setting_with_description_default_and_variable(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit) as exit_:
        parse_settings(ExecutorSettings, ["--help"], prog=PROG)
    assert exit_.value.code == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "--dry-run, --no-dry-run only publish what would be done (default: False)" in text
    assert "TIDESHIFT_DRY_RUN" in text
    assert "--max-attempts int deliveries of a command" in text


def test_a_bad_value_is_one_line_naming_flag_and_variable(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit) as exit_:
        parse_settings(ExecutorSettings, ["--max-step", "-4"], prog=PROG)
    assert exit_.value.code == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith(f"{PROG}: invalid --max-step (env TIDESHIFT_MAX_STEP)")
