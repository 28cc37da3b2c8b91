"""The chart runs predictor replicas sharded when there are several, and keeps a single one as
it was (each forecasting every workload)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tests.unit.chart.chart_support import (
    by_kind,
    component,
    container_env,
    render,
    render_error,
)

# Per-message TTLs (each replica's key expires by itself) came with nats-server 2.11.
NATS_2_11 = {"nats": {"bundled": {"image": {"tag": "2.11.9-alpine"}}}}


def predictor(tmp_path: Path, replicas: int) -> tuple[dict[str, Any], dict[str, Any]]:
    objects = render(tmp_path, {"predictor": {"replicas": replicas}, **NATS_2_11})
    deployment = next(
        d for d in by_kind(objects, "Deployment").values() if component(d) == "predictor"
    )
    budgets = by_kind(objects, "PodDisruptionBudget").values()
    budget = next(b for b in budgets if component(b) == "predictor")
    return deployment, budget


def test_several_predictor_replicas_share_the_workloads(tmp_path: Path) -> None:
    deployment, budget = predictor(tmp_path, 3)
    assert deployment["spec"]["replicas"] == 3
    assert container_env(deployment)["TIDESHIFT_SHARDED"] == "true"
    # A drain takes one replica at a time: the others take its share within the lease TTL.
    assert budget["spec"]["maxUnavailable"] == 1


def test_a_single_predictor_forecasts_every_workload(tmp_path: Path) -> None:
    deployment, _ = predictor(tmp_path, 1)
    assert container_env(deployment)["TIDESHIFT_SHARDED"] == "false"


def test_several_predictor_replicas_refuse_a_bundled_nats_older_than_2_11(tmp_path: Path) -> None:
    older = {"nats": {"bundled": {"image": {"tag": "2.10.24-alpine"}}}}
    error = render_error(tmp_path, {"predictor": {"replicas": 2}, **older})
    assert "needs nats-server 2.11 or later" in error
    # An external NATS is the operator's to vouch for; the predictor checks its bucket at start.
    objects = render(
        tmp_path,
        {
            "predictor": {"replicas": 2},
            "nats": {"bundled": {"enabled": False}, "url": "nats://n:4222"},
        },
    )
    assert by_kind(objects, "Deployment")
