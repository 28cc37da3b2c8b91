"""`tideshift demo` end to end in its embedded default: a short day on the sim cluster.

Everything real except the cluster: embedded nats-server, every service over NATS, real trainer
processes. The summary must show the day/night trade: more trainers at night than by day,
and serving never short of capacity.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]


@pytest.mark.timeout(420)
def test_a_short_day_trades_training_for_serving(tmp_path: Path) -> None:
    out = tmp_path / "demo-out"
    env = dict(os.environ)
    # A day at 720x: two minutes of wall time (plus start-up).
    completed = subprocess.run(
        [
            sys.executable,
            "-m",
            "tideshift.services.cli",
            "demo",
            "--out",
            str(out),
            "--hours",
            "24",
            "--speed",
            "1440",
            # the three jobs on requests alone: the batch job's 20-odd real trainer processes
            # by day would double this test's time (lending: tests/unit/demo/test_demo_lending)
            "--no-lend",
            "--quiet",
        ],
        capture_output=True,
        text=True,
        timeout=400,
        env=env,
        cwd=REPO,
    )
    assert completed.returncode == 0, completed.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["training_grew_at_night"] is True, summary
    night = sum(summary["trainers_night_mean"].values())
    day = sum(summary["trainers_day_mean"].values())
    assert night >= day + 2, summary
    assert summary["shortfall_minutes"] == 0, summary
    assert summary["jobs_started"] == summary["jobs_total"] == 3
    assert summary["utilization"]["cpu"] > 0.5
    assert summary["cpu_lent"] == 0  # no batch job with --no-lend
    # The pipeline really ran over NATS: forecasts, plans, commands and results are in the log.
    kinds = summary["events"]
    for kind in (
        "io.tideshift.forecast.issued.v1",
        "io.tideshift.scale.command.v1",
        "io.tideshift.scale.result.v1",
        "io.tideshift.cluster.pod.changed.v1",
    ):
        assert kinds.get(kind, 0) > 0, (kind, kinds)
    lines = (out / "events.jsonl").read_text().splitlines()
    assert len(lines) == sum(kinds.values())
    assert json.loads(lines[0])["specversion"] == "1.0"
    # Real trainers trained: shards were applied by the parameter servers.
    assert any(job["applied_total"] > 0 for job in summary["training"].values()), summary
    # ... and their model improved on data no trainer saw (read back from the pservers).
    assert any(job.get("holdout_logloss") for job in summary["training"].values()), summary
    png = (out / "demo.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    assert "train work" in (out / "summary.txt").read_text()
