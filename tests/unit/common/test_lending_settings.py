"""One lending margin for the planner and the executor: declared once (`LendingSettings`),
read by both, and still set by the names each used before (flags, keywords, environment)."""

from __future__ import annotations

import pytest

from tideshift.services.cluster.core.overcommit import OvercommitConfig
from tideshift.services.common.settings import (
    DEFAULT_LEND_MARGIN,
    LendingSettings,
    parse_settings,
)
from tideshift.services.executor.settings import ExecutorSettings
from tideshift.services.planner.settings import PlannerSettings


def test_the_default_is_what_the_overcommit_model_never_lends() -> None:
    assert OvercommitConfig().margin == DEFAULT_LEND_MARGIN
    assert PlannerSettings().policy_config().overcommit.margin == DEFAULT_LEND_MARGIN
    assert ExecutorSettings().lending().margin == DEFAULT_LEND_MARGIN


def test_one_setting_is_read_by_both_services(monkeypatch: pytest.MonkeyPatch) -> None:
    assert issubclass(PlannerSettings, LendingSettings)
    assert issubclass(ExecutorSettings, LendingSettings)
    monkeypatch.setenv("TIDESHIFT_LEND_MARGIN", "0.25")
    assert PlannerSettings().policy_config().overcommit.margin == 0.25
    assert ExecutorSettings().lending().margin == 0.25


@pytest.mark.parametrize("old", ["overcommit_margin", "batch_margin"])
def test_the_old_names_still_set_it(old: str, monkeypatch: pytest.MonkeyPatch) -> None:
    flag = "--" + old.replace("_", "-")
    for settings_class in (PlannerSettings, ExecutorSettings):
        assert parse_settings(settings_class, [flag, "0.3"], prog="t").lend_margin == 0.3
        assert parse_settings(settings_class, [f"{flag}=0.31"], prog="t").lend_margin == 0.31
        assert settings_class(**{old: 0.35}).lend_margin == 0.35
    monkeypatch.setenv(f"TIDESHIFT_{old.upper()}", "0.4")
    assert PlannerSettings().lend_margin == ExecutorSettings().lend_margin == 0.4
    monkeypatch.setenv("TIDESHIFT_LEND_MARGIN", "0.2")  # the new name wins
    assert PlannerSettings().lend_margin == 0.2


def test_no_unprefixed_environment_variable_is_read(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("LEND_MARGIN", "OVERCOMMIT_MARGIN", "BATCH_MARGIN"):
        monkeypatch.setenv(name, "0.5")
    assert PlannerSettings().lend_margin == ExecutorSettings().lend_margin == DEFAULT_LEND_MARGIN


def test_out_of_range_is_refused() -> None:
    with pytest.raises(ValueError, match="lend_margin"):
        ExecutorSettings(lend_margin=1.0)


def test_a_bad_value_under_an_old_name_names_the_old_names_too(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit):
        parse_settings(ExecutorSettings, ["--batch-margin", "2"], prog="t")
    assert capsys.readouterr().err.startswith(
        "t: invalid --lend-margin (env TIDESHIFT_LEND_MARGIN; "
        "old names --overcommit-margin, --batch-margin): "
    )
