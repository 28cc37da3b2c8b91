"""The core image (watcher, planner, executor, the chart's jobs and test) has no forecasters.

The `forecast` extra (pandas, scipy, statsmodels, statsforecast) is the predictor image's only:
here it is absent, and a command that forecasts says in one line which extra it needs instead
of a traceback. tests/image/test_image_services.py runs the core services from this image.
"""

from __future__ import annotations

import pytest

from tests.image.podman_cli import RESTRICTED, podman

FORECASTERS = ("pandas", "scipy", "statsmodels", "statsforecast")
PROBE = (
    "import importlib.util; "
    f"print(sorted(name for name in {(*FORECASTERS, 'numpy')!r} if importlib.util.find_spec(name)))"
)


def test_the_core_image_has_numpy_but_no_forecasting_library(
    image: str, predictor_image: str
) -> None:
    core = podman("run", "--rm", *RESTRICTED, "--entrypoint", "python", image, "-c", PROBE)
    assert core.stdout.strip() == "['numpy']", core.stdout + core.stderr
    full = podman(
        "run", "--rm", *RESTRICTED, "--entrypoint", "python", predictor_image, "-c", PROBE
    )
    assert full.stdout.strip() == str(sorted((*FORECASTERS, "numpy"))), full.stdout + full.stderr


@pytest.mark.parametrize(
    "command", [["run", "predictor", "--help"], ["backtest", "--help"], ["simulate", "--help"]]
)
def test_a_forecasting_command_names_the_extra_it_needs(image: str, command: list[str]) -> None:
    answer = podman("run", "--rm", *RESTRICTED, image, *command, check=False)
    assert answer.returncode == 2, answer.stdout + answer.stderr
    assert answer.stdout == ""
    (line,) = answer.stderr.splitlines()
    assert line.startswith(f"tideshift {command[0]}: needs the 'forecast' extra (No module named")
    assert "pip install 'tideshift[forecast]'" in line
