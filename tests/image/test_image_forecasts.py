"""The predictor's image forecasts exactly as the development environment does.

That image leaves statsforecast's distributed engine out (fugue, and pyarrow with it: see the
Dockerfile); its models are the same code. The rolling-origin backtest of the statsforecast
models and of the portfolio that combines them runs in a container, as the chart runs the
services (read-only root, /tmp only), and in this venv: every score must agree.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.image.podman_cli import RESTRICTED, podman

BIN = Path(sys.executable).parent
# Four days of a daily-drift family on a 5-minute grid: three of warm-up, a day of origins.
BACKTEST = [
    "backtest",
    "--family",
    "daily_drift",
    "--family-days",
    "4",
    "--family-interval",
    "5m",
    "--warmup",
    "3d",
    "--step",
    "30m",
    "--refit",
    "12h",
    "--models",
    "mstl,auto_theta,portfolio",
    "--json",
    "--quiet",
]


def scores(document: str) -> dict[tuple[str, str], float]:
    """Each model's accuracy figures, without its fit+predict time."""
    models: dict[str, dict[str, float]] = json.loads(document)["models"]
    return {
        (name, key): value
        for name, figures in models.items()
        for key, value in figures.items()
        if key != "seconds"
    }


def test_statsforecast_models_forecast_in_the_image_as_in_the_venv(predictor_image: str) -> None:
    here = subprocess.run(
        [str(BIN / "tideshift"), *BACKTEST], capture_output=True, text=True, check=True
    )
    # OpenBLAS picks its kernels by CPU unless told (OPENBLAS_CORETYPE): the same on both sides,
    # or Holt-Winters' optimiser differs in the eighth digit.
    blas = [f"--env={name}" for name in sorted(os.environ) if name.startswith("OPENBLAS_")]
    there = podman(
        "run", "--rm", *RESTRICTED, *blas, predictor_image, *BACKTEST, check=False, timeout=300
    )
    assert there.returncode == 0, f"backtest in the image failed:\n{there.stderr[-3000:]}"
    expected = scores(here.stdout)
    assert {name for name, _ in expected} == {"mstl", "auto_theta", "portfolio"}
    assert scores(there.stdout) == pytest.approx(expected, rel=1e-9)


def test_the_image_leaves_the_distributed_engine_out(predictor_image: str) -> None:
    probe = (
        "import importlib.util, sys; from statsforecast.models import MSTL, AutoTheta; "
        "print(sorted(name for name in ('fugue', 'pyarrow', 'triad') "
        "if importlib.util.find_spec(name) or name in sys.modules))"
    )
    answer = podman(
        "run", "--rm", *RESTRICTED, "--entrypoint", "python", predictor_image, "-c", probe
    )
    assert answer.stdout.strip() == "[]", answer.stdout + answer.stderr
