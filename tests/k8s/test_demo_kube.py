"""`tideshift demo --cluster PATH` end to end against the test control plane, with a short day.

Real API server (kwok nodes), real HTTP from the load generator to the sample app, a real
Prometheus scraping it and feeding the predictor, every service as its own process over NATS.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.fixtures.k8s import K8sCluster

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_a_short_day_on_a_real_api_server(
    k8s_cluster: K8sCluster, prometheus_binary: str, tmp_path: Path
) -> None:
    out = tmp_path / "demo-out"
    env = dict(os.environ)
    env.pop("KUBECONFIG", None)
    # 16 simulated hours at 360x (night, the morning ramp and the 14:00 peak): under three
    # minutes of real time, real requests at up to 200 req/s.
    completed = subprocess.run(
        [
            sys.executable,
            "-m",
            "tideshift.services.cli",
            "demo",
            "--cluster",
            str(k8s_cluster.kubeconfig),
            "--out",
            str(out),
            "--hours",
            "16",
            "--speed",
            "360",
            "--quiet",
        ],
        capture_output=True,
        text=True,
        timeout=850,
        env=env,
        cwd=REPO,
    )
    assert completed.returncode == 0, completed.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    kinds = summary["events"]
    for kind in (
        "io.tideshift.cluster.pod.changed.v1",
        "io.tideshift.forecast.issued.v1",
        "io.tideshift.scale.command.v1",
        "io.tideshift.scale.result.v1",
    ):
        assert kinds.get(kind, 0) > 0, (kind, kinds)
    events = [json.loads(line) for line in (out / "events.jsonl").read_text().splitlines()]
    forecasts = [e["data"] for e in events if e["type"] == "io.tideshift.forecast.issued.v1"]
    assert any(not f["stale"] for f in forecasts)  # Prometheus answered
    applied = [
        e["data"]
        for e in events
        if e["type"] == "io.tideshift.scale.result.v1" and e["data"]["outcome"] == "applied"
    ]
    assert any(r["target"]["kind"] == "Deployment.apps" for r in applied), applied[:5]
    # The load generator held its rate against the real app (open loop).
    text = (out / "summary.txt").read_text()
    assert "load:" in text
    assert any(job["applied_total"] > 0 for job in summary["training"].values()), summary
    assert (out / "demo.png").read_bytes()[:4] == b"\x89PNG"
    assert summary["shortfall_fraction"] < 0.05, summary
    load = summary["load"]
    assert load["offered"] == pytest.approx(load["expected"], rel=0.05)
    assert load["succeeded"] > 0.95 * load["sent"]
