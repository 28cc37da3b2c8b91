"""The dashboard's main panels as a PNG (docs/images/dashboard.png), drawn with matplotlib from
the dashboard's own queries on real data: the services run as processes on nats-server and the
local control plane (tests/integration/observability/stack.py), a real Prometheus scrapes
them, and demand follows a compressed day (a cosine over RUN_S seconds, from its high).

Run: .venv/bin/pytest -s tests/benchmarks/bench_dashboard_png.py
(not collected by `make test`: it runs for several minutes to draw a picture).
"""

from __future__ import annotations

import asyncio
import math
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.integration.observability.stack import (
    dashboard_queries,
    monitored_stack,
    wait_for_scrapes,
)
from tests.integration.observability.test_dashboard_queries import dead_letter

REPO = Path(__file__).resolve().parents[2]
OUT = REPO / "docs" / "images" / "dashboard.png"
RUN_S = 480.0
LOW, HIGH = 80.0, 900.0  # req/s; one web replica serves 100
# The panels drawn, by title; the others (leader, stale forecasts, lent cpu) are flat here.
PANELS = (
    "Demand vs capacity per serving workload",
    "Forecast quantiles per serving workload",
    "Shortfall per serving workload",
    "Trainers per job",
    "Plan latency",
    "Executor loop latency",
    "Plans and commands",
    "Dead letters and rejections",
)


def demand(elapsed: float) -> float:
    """Evening to evening: high, down to the night's low, back up."""
    return LOW + (HIGH - LOW) * (1 + math.cos(2 * math.pi * elapsed / RUN_S)) / 2


@pytest.mark.timeout(1200)
def test_draw_the_dashboard(
    k8s_cluster: Any, prometheus_binary: str, tmp_path_factory: pytest.TempPathFactory
) -> None:
    workdir = tmp_path_factory.mktemp("dashboard")
    with monitored_stack(k8s_cluster, prometheus_binary, workdir, initial_rate=HIGH) as stack:
        wait_for_scrapes(stack)
        started = time.time()
        dead_lettered = False
        while (elapsed := time.time() - started) < RUN_S:
            stack.alive()
            stack.set_rate(demand(elapsed))
            if not dead_lettered and elapsed > RUN_S / 2:
                asyncio.run(dead_letter(stack.nats_url))
                dead_lettered = True
            time.sleep(1.0)  # the load's own pace: one rate change a second
        queries = [q for q in dashboard_queries() if q[0] in PANELS]
        series = {
            (title, legend): stack.query_range(expr, start=started, end=time.time(), step=5)
            for title, legend, expr in queries
        }
    draw(series, started)
    print(f"\ndashboard: {OUT} ({OUT.stat().st_size} bytes) from {len(series)} queries")


def draw(series: dict[tuple[str, str], list[dict[str, Any]]], started: float) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(4, 2, figsize=(14, 13), sharex=True)
    for axis, title in zip(axes.flat, PANELS, strict=True):
        for (panel, legend), results in series.items():
            if panel != title:
                continue
            for result in results:
                points = np.array(result["values"], dtype=float)
                label = legend
                for key, value in result["metric"].items():
                    label = label.replace("{{" + key + "}}", value)
                axis.plot((points[:, 0] - started) / 60, points[:, 1], label=label, lw=1.2)
        axis.set_title(title, fontsize=10)
        axis.legend(fontsize=7, loc="upper left")
        axis.grid(alpha=0.3)
    for axis in axes[-1]:
        axis.set_xlabel("minutes")
    figure.suptitle("Tideshift dashboard (the chart's queries on a live run)")
    figure.tight_layout()
    OUT.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(OUT, dpi=80)
    plt.close(figure)
