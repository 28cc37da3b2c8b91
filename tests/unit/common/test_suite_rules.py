"""Rules of the test suite itself: CI fails on a missing dependency, benchmarks are not tests."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

from tests.fixtures.requirements import REPOSITORY, missing_dependency, shared_trace

BENCHMARKS = REPOSITORY / "tests" / "benchmarks"


def test_ci_script_runs_the_suite_with_ci_set() -> None:
    script = (REPOSITORY / ".ci" / "run").read_text()
    assert "export CI=true" in script.splitlines()
    assert script.index("export CI=true") < script.index("make test")


@pytest.mark.parametrize("path", sorted(BENCHMARKS.glob("*.py")), ids=lambda path: path.name)
def test_benchmarks_are_scripts_not_tests(path: Path) -> None:
    tree = ast.parse(path.read_text())
    functions = {node.name for node in tree.body if isinstance(node, ast.FunctionDef)}
    assert "main" in functions, f"{path.name} has no main()"
    assert not [name for name in functions if name.startswith("test")], (
        f"{path.name} defines test functions: a benchmark prints figures, it asserts nothing"
    )


def test_pytest_collects_nothing_under_benchmarks() -> None:
    command = [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider"]
    collecting = subprocess.run(
        [*command, str(BENCHMARKS)],
        cwd=REPOSITORY,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert collecting.returncode == pytest.ExitCode.NO_TESTS_COLLECTED, collecting.stdout


def test_a_missing_dependency_fails_under_ci_and_skips_elsewhere(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("TIDESHIFT_TRACE_DIR", str(tmp_path))
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match="TIDESHIFT_TRACE_DIR"):
        shared_trace("absent.csv")
    monkeypatch.setenv("CI", "")
    with pytest.raises(pytest.skip.Exception, match="not found"):
        shared_trace("absent.csv")
    (tmp_path / "present.csv").write_text("timestamp_s,requests\n")
    assert shared_trace("present.csv") == tmp_path / "present.csv"
    monkeypatch.setenv("CI", "1")
    with pytest.raises(pytest.fail.Exception, match="helm"):
        missing_dependency("helm missing")
