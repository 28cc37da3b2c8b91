"""The dashboard's main panels as a PNG (docs/images/dashboard.png), drawn with matplotlib from
the dashboard's own queries on real data: the services run as processes on nats-server and a
local control plane (tests/integration/observability/stack.py), a real Prometheus scrapes
them, and demand follows a compressed day (a cosine over --seconds, from its high).

Usage: .venv/bin/python tests/benchmarks/bench_dashboard_png.py [--seconds 480] [--out PNG]
It runs for several minutes to draw a picture; it asserts nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from tests.fixtures.k8s import DEFAULT_NODES, K8sCluster  # noqa: E402
from tests.integration.observability.stack import (  # noqa: E402
    dashboard_queries,
    monitored_stack,
    wait_for_scrapes,
)
from tests.integration.observability.test_dashboard_queries import dead_letter  # noqa: E402
from tideshift.services.devcluster.cluster import ClusterOptions, LocalCluster  # noqa: E402
from tideshift.services.devcluster.versions import default_bin_dir  # noqa: E402

DEFAULT_OUT = ROOT / "docs" / "images" / "dashboard.png"
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


def demand(elapsed: float, run_s: float) -> float:
    """Evening to evening: high, down to the night's low, back up."""
    return LOW + (HIGH - LOW) * (1 + math.cos(2 * math.pi * elapsed / run_s)) / 2


def pace(stack: Any, period_s: float) -> None:
    """One period of the load's pace, cut short by a service that exits (stack.alive raises:
    checked every 0.1 s)."""
    deadline = time.monotonic() + period_s
    while time.monotonic() < deadline:
        stack.alive()
        time.sleep(0.1)


def record(cluster: K8sCluster, prometheus: str, workdir: Path, run_s: float) -> tuple[Any, float]:
    """Drives a compressed day through the stack: each panel's series and the start time."""
    with monitored_stack(cluster, prometheus, workdir, initial_rate=HIGH) as stack:
        print("waiting for Prometheus to scrape every service ...", flush=True)
        wait_for_scrapes(stack)
        started = time.time()
        dead_lettered = False
        reported = 0  # progress lines, one each 30 s
        while (elapsed := time.time() - started) < run_s:
            stack.alive()
            stack.set_rate(demand(elapsed, run_s))
            if not dead_lettered and elapsed > run_s / 2:
                asyncio.run(dead_letter(stack.nats_url))
                dead_lettered = True
            if elapsed >= 30 * (reported + 1):
                reported += 1
                print(f"{elapsed:.0f} s: demand {demand(elapsed, run_s):.0f} req/s", flush=True)
            pace(stack, 1.0)  # one rate change a second
        queries = [q for q in dashboard_queries() if q[0] in PANELS]
        series = {
            (title, legend): stack.query_range(expr, start=started, end=time.time(), step=5)
            for title, legend, expr in queries
        }
    return series, started


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=480.0, help="the day's length (480)")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help=f"(default {DEFAULT_OUT})")
    args = parser.parse_args()
    prometheus = shutil.which("prometheus")
    if prometheus is None:
        print("error: the prometheus binary is missing: apt-get install prometheus")
        return 1
    # kept after the run: the services' logs, for a run that fails
    workdir = Path(tempfile.mkdtemp(prefix="tideshift-bench-dashboard-"))
    print(f"starting a control plane with 4 kwok nodes (logs in {workdir}) ...", flush=True)
    options = ClusterOptions(
        bin_dir=default_bin_dir(), state_dir=workdir / "k8s", nodes=DEFAULT_NODES
    )
    local = LocalCluster(options)
    try:
        began = time.monotonic()
        local.start()
        cluster = K8sCluster(local, time.monotonic() - began, list(DEFAULT_NODES))
        series, started = record(cluster, prometheus, workdir / "stack", args.seconds)
    except (AssertionError, TimeoutError, RuntimeError, OSError) as error:
        # the stack's checks: a service that exited, a condition never reached
        print(f"error: {error}; logs in {workdir}")
        return 1
    finally:
        local.stop()
    draw(series, started, args.out)
    print(f"dashboard: {args.out} ({args.out.stat().st_size} bytes) from {len(series)} queries")
    return 0


def draw(series: dict[tuple[str, str], list[dict[str, Any]]], started: float, out: Path) -> None:
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
    out.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(out, dpi=80)
    plt.close(figure)


if __name__ == "__main__":
    sys.exit(main())
