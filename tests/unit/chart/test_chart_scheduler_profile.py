"""The chart's `tideshift-packing` scheduler profile is the one the local control plane runs."""

from __future__ import annotations

from pathlib import Path

import yaml

from tideshift.services.devcluster.scheduler_profile import (
    PACKING_SCHEDULER,
    packing_profile,
    write_scheduler_config,
)

CHART_PROFILE = (
    Path(__file__).resolve().parents[3]
    / "charts"
    / "tideshift"
    / "files"
    / "scheduler-packing.yaml"
)


def test_chart_documents_the_profile_the_devcluster_runs(tmp_path: Path) -> None:
    documented = yaml.safe_load(CHART_PROFILE.read_text())
    written = yaml.safe_load(
        write_scheduler_config(tmp_path / "config.yaml", tmp_path / "k.kubeconfig").read_text()
    )
    assert documented["profiles"] == written["profiles"]
    assert [p["schedulerName"] for p in written["profiles"]] == [
        "default-scheduler",
        PACKING_SCHEDULER,
    ]
    assert written["clientConnection"]["kubeconfig"] == str(tmp_path / "k.kubeconfig")


def test_profile_packs_with_gpus_weighted() -> None:
    fit = next(c for c in packing_profile()["pluginConfig"] if c["name"] == "NodeResourcesFit")
    strategy = fit["args"]["scoringStrategy"]
    assert strategy["type"] == "MostAllocated"
    weights = {r["name"]: r["weight"] for r in strategy["resources"]}
    assert weights["nvidia.com/gpu"] > weights["cpu"]
