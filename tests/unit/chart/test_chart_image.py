"""The Dockerfile and the chart agree: the image runs `tideshift` as the non-root user the
chart's security context names, and installs the package the way users do (`pip`)."""

from __future__ import annotations

import json

import yaml

from tests.unit.chart.chart_support import CHART, REPO

DOCKERFILE = (REPO / "Dockerfile").read_text()
INSTRUCTIONS = [
    line.strip()
    for line in DOCKERFILE.replace("\\\n", " ").splitlines()
    if line.strip() and not line.lstrip().startswith("#")
]
VALUES = yaml.safe_load((CHART / "values.yaml").read_text())


def instructions(keyword: str) -> list[str]:
    return [line.split(None, 1)[1] for line in INSTRUCTIONS if line.split()[0] == keyword]


def test_image_is_multi_stage_and_installs_the_package_with_pip() -> None:
    stages = instructions("FROM")
    assert len(stages) == 2 and stages[0].endswith("AS build")
    assert any("pip wheel" in run and run.rstrip().endswith(".") for run in instructions("RUN"))
    assert any("pip install" in run and "tideshift" in run for run in instructions("RUN"))


def test_image_runs_tideshift_as_the_charts_non_root_user() -> None:
    (user,) = instructions("USER")
    uid, gid = (int(part) for part in user.split(":"))
    assert uid != 0 and gid != 0
    assert uid == VALUES["podSecurityContext"]["runAsUser"]
    assert gid == VALUES["podSecurityContext"]["runAsGroup"]
    assert json.loads(instructions("ENTRYPOINT")[0]) == ["tideshift"]


def test_image_exposes_the_charts_health_port() -> None:
    assert instructions("EXPOSE") == [str(VALUES["healthPort"])]
