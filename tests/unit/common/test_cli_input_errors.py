"""Every command-line input error is one line naming the field and what was expected, exit
status 2 and no traceback (issue 25 part 8): the real `tideshift` command as a process."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

NODES = "nodes: [{count: 2, cpu: 4, memory_gib: 8}]\n"

# name -> (scenario file bytes, words the error line must hold)
SCENARIOS: dict[str, tuple[bytes, str]] = {
    "huge duration": (b"duration_s: 1e308\n" + NODES.encode(), "duration_s"),
    "infinite duration": (b"duration_s: .inf\n" + NODES.encode(), "duration_s"),
    "unbounded run": (b"duration_s: 1e9\n" + NODES.encode(), "duration_s"),
    "NaN step": (b"duration_s: 60\nstep_s: .nan\n" + NODES.encode(), "step_s"),
    "tiny step": (b"duration_s: 100\nstep_s: 1e-9\n" + NODES.encode(), "step_s"),
    "too many steps": (b"duration_s: 2000000\nstep_s: 0.5\n" + NODES.encode(), "step_s"),
    "billion nodes": (
        b"duration_s: 60\nnodes: [{count: 1000000000, cpu: 4, memory_gib: 8}]\n",
        "nodes.0.count",
    ),
    "deep YAML": (b"duration_s: 60\nx: " + b"[" * 100_000 + b"]" * 100_000 + b"\n", "nested"),
    "invalid UTF-8": (b"duration_s: 60\nname: \xff\xfe\n" + NODES.encode(), "UTF-8"),
    "not a mapping": (b"- 1\n", "mapping"),
}


def tideshift(*args: str, timeout: float = 60.0) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tideshift.services.cli", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def assert_one_line_error(result: subprocess.CompletedProcess[str], *words: str) -> None:
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr, result.stderr
    last = result.stderr.strip().splitlines()[-1]
    for word in words:
        assert word in last, last
    # argparse prints its usage above the error line; nothing else may come before it.
    others = [line for line in result.stderr.strip().splitlines()[:-1] if "usage" not in line]
    assert all(line.startswith(" ") for line in others), result.stderr


@pytest.mark.parametrize("case", list(SCENARIOS))
def test_simulate_refuses_a_hostile_scenario_in_one_line(case: str, tmp_path: Path) -> None:
    text, field = SCENARIOS[case]
    path = tmp_path / "scenario.yaml"
    path.write_bytes(text)
    assert_one_line_error(tideshift("simulate", "--scenario", str(path)), field)


def test_simulate_refuses_an_unwritable_out_before_running(tmp_path: Path) -> None:
    path = tmp_path / "scenario.yaml"
    path.write_text("duration_s: 60\n" + NODES)
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    result = tideshift("simulate", "--scenario", str(path), "--out", str(blocker / "plots"))
    assert_one_line_error(result, "--out", "writable directory")


@pytest.mark.parametrize("duration", ["1e9", "inf", "nan", "-1"])
def test_simulate_bounds_the_duration_override(duration: str, tmp_path: Path) -> None:
    path = tmp_path / "scenario.yaml"
    path.write_text("duration_s: 60\n" + NODES)
    assert_one_line_error(
        tideshift("simulate", "--scenario", str(path), "--duration", duration), "--duration"
    )


def test_simulate_json_is_strict_json(tmp_path: Path) -> None:
    import json

    path = tmp_path / "scenario.yaml"
    # No serving and no jobs: ratios over nothing are where a NaN would come from.
    path.write_text("duration_s: 60\n" + NODES)
    result = tideshift("simulate", "--scenario", str(path), "--policy", "static", "--json")
    assert result.returncode == 0, result.stderr
    json.loads(result.stdout, parse_constant=lambda name: pytest.fail(f"{name} in --json"))


def test_backtest_refuses_a_device_as_trace() -> None:
    assert_one_line_error(tideshift("backtest", "--trace", "/dev/zero"), "--trace", "regular")


def test_backtest_refuses_an_over_long_field(tmp_path: Path) -> None:
    path = tmp_path / "trace.csv"
    path.write_text("timestamp_s,requests\n0,1\n60," + "9" * 200_000 + "\n")
    assert_one_line_error(tideshift("backtest", "--trace", str(path)), "line 3", "at most")


def test_backtest_refuses_invalid_utf8(tmp_path: Path) -> None:
    path = tmp_path / "trace.csv"
    path.write_bytes(b"timestamp_s,requests\n0,\xff\n")
    assert_one_line_error(tideshift("backtest", "--trace", str(path)), "UTF-8")


@pytest.mark.parametrize(
    ("args", "field"),
    [
        (["--family-days", "1e9"], "--family-days"),
        (["--family-days", "inf"], "--family-days"),
        (["--family-days", "3000", "--family-interval", "1s"], "--family-interval"),
    ],
)
def test_backtest_bounds_a_generated_family(args: list[str], field: str) -> None:
    assert_one_line_error(tideshift("backtest", "--family", "weekly", *args), field)


@pytest.mark.parametrize(
    ("args", "field"),
    [
        (["--step-seconds", "inf"], "--step-seconds"),
        (["--step-seconds", "1e-9"], "--horizon-seconds"),
        (["--history-seconds", "1e308"], "--history-seconds"),
    ],
)
def test_predictor_settings_are_bounded(args: list[str], field: str) -> None:
    assert_one_line_error(tideshift("run", "predictor", *args), field)


def test_unknown_command_and_service_are_one_line() -> None:
    assert_one_line_error(tideshift("run", "nope"), "unknown service")
