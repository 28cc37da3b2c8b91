"""The wheel ships one import package, `tideshift`, mapped from the repository's folders."""

from __future__ import annotations

import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
FOLDERS = ("events", "services", "loadgen")


def _declared() -> tuple[dict[str, str], list[str]]:
    config = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]
    return config["package-dir"], config["packages"]


def test_every_folder_with_an_init_is_a_declared_package() -> None:
    package_dir, packages = _declared()
    assert package_dir == {f"tideshift.{folder}": folder for folder in FOLDERS}
    on_disk = sorted(
        "tideshift." + ".".join(init.parent.relative_to(REPO).parts)
        for folder in FOLDERS
        for init in (REPO / folder).rglob("__init__.py")
        if "__pycache__" not in init.parts
    )
    assert sorted(packages) == on_disk


def test_the_wheel_installs_exactly_one_top_level_package(tmp_path: Path) -> None:
    # Build from a copy: setuptools leaves build/ behind, and a stale build/ in the repository
    # would leak deleted modules into later wheels.
    source = tmp_path / "source"
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, source / name)
    for folder in FOLDERS:
        shutil.copytree(
            REPO / folder, source / folder, ignore=shutil.ignore_patterns("__pycache__")
        )
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(tmp_path), str(source)],
        check=True,
        capture_output=True,
        timeout=300,
    )
    (wheel,) = tmp_path.glob("tideshift-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    top_level = {
        name.split("/")[0] for name in names if not name.split("/")[0].endswith(".dist-info")
    }
    assert top_level == {"tideshift"}
    assert "tideshift/events/models.py" in names
    assert "tideshift/services/planner/core/plan.py" in names
    assert "tideshift/loadgen/scenarios/day-night-nasa.yaml" in names
    assert not any(name.startswith("tideshift/__init__") for name in names), (
        "tideshift is a namespace"
    )
