"""`tideshift` runs OpenBLAS single-threaded unless the user says otherwise: a fork in one
thread while another is inside a multi-threaded BLAS call can leave that call waiting for ever."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tideshift.services.cli import main


def test_every_subcommand_runs_with_one_blas_thread(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OPENBLAS_NUM_THREADS", raising=False)
    assert main(["no-such-command"]) == 2
    assert os.environ["OPENBLAS_NUM_THREADS"] == "1"


def test_the_users_own_setting_wins(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENBLAS_NUM_THREADS", "4")
    assert main(["no-such-command"]) == 2
    assert os.environ["OPENBLAS_NUM_THREADS"] == "4"


def test_the_entry_point_loads_no_numpy_before_it_sets_the_threads() -> None:
    """OpenBLAS reads the setting once, when numpy loads it: the entry module must not."""
    probe = "import sys, tideshift.services.cli; print('numpy' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
