"""The chart's one value for observe mode, `executor.config.mode`, reaches the executor: rendered
with `observe`, then upgraded to `act` (the same values with one key changed, as `helm upgrade
--reuse-values --set executor.config.mode=act` gives them), the executor container's
environment parses into those settings; a value that is neither is refused by the schema."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.unit.chart.chart_support import by_kind, component, container_env, render, render_error
from tideshift.services.executor.service import ExecutorSettings


def executor_settings(
    tmp_path: Path, mode: str, monkeypatch: pytest.MonkeyPatch
) -> ExecutorSettings:
    objects = render(tmp_path, {"executor": {"config": {"mode": mode}}})
    (executor,) = [d for d in by_kind(objects, "Deployment").values() if component(d) == "executor"]
    env = container_env(executor)
    assert env["TIDESHIFT_MODE"] == mode
    for name, value in env.items():
        if isinstance(value, str) and name.startswith("TIDESHIFT_"):
            monkeypatch.setenv(name, value)
    monkeypatch.delenv("TIDESHIFT_NATS_PASSWORD_FILE", raising=False)
    return ExecutorSettings()


@pytest.mark.parametrize("mode", ["observe", "act"])
def test_the_mode_value_reaches_the_executor(
    mode: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert executor_settings(tmp_path, mode, monkeypatch).mode == mode


def test_a_mode_that_is_neither_is_refused_at_install(tmp_path: Path) -> None:
    error = render_error(tmp_path, {"executor": {"config": {"mode": "watch"}}})
    assert "mode" in error and "act" in error and "observe" in error
