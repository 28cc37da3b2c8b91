"""`tideshift dev cluster up` starts the engines by default and `down` stops them."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tideshift.services.devcluster.engines import ENGINE_NAMES, ENGINES
from tideshift.services.devcluster.processes import load_state, pid_alive, state_processes

pytestmark = pytest.mark.k8s


def _tideshift(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tideshift.services.cli", *args],
        capture_output=True,
        text=True,
        timeout=420,
        env=os.environ.copy(),
    )


def test_up_starts_the_engines_and_down_stops_them(
    k8s_bin_dir: Path, engines_dir: Path, tmp_path: Path
) -> None:
    state_dir = tmp_path / "devcluster"
    common = ("--state-dir", str(state_dir))
    up = _tideshift("dev", "cluster", "up", *common, "--nodes", "1", "--gpu-nodes", "0")
    assert up.returncode == 0, up.stderr + up.stdout
    records = state_processes(load_state(state_dir) or {})
    try:
        assert {record.name for record in records} >= set(ENGINE_NAMES)
        assert all(pid_alive(record.pid) for record in records)
        for name in ENGINE_NAMES:
            assert (state_dir / "logs" / f"{name}.log").stat().st_size > 0
        status = _tideshift("dev", "cluster", "status", *common)
        assert status.returncode == 0, status.stdout
        assert all(name in status.stdout for name in ENGINE_NAMES)
        assert f"kueue {ENGINES['kueue'].version}" in status.stdout
    finally:
        down = _tideshift("dev", "cluster", "down", *common)
    assert down.returncode == 0, down.stderr
    assert all(name in down.stdout for name in ENGINE_NAMES)
    assert not any(pid_alive(record.pid) for record in records)
