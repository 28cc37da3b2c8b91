"""Draws the compressed day with the real Kueue (tests/k8s/engines/kueue_day.py) as a PNG: the
cpu quota lent to the ClusterQueue against serving's need (now and over the lead time), what
Kueue admitted, and each preemption.

    TIDESHIFT_KUEUE_DAY_STEPS=24 TIDESHIFT_KUEUE_DAY_OUT=/tmp/kueue-day.json \\
      .venv/bin/pytest -q -s tests/k8s/engines/test_engines_kueue_day.py
    .venv/bin/python tests/benchmarks/plot_kueue_day.py \\
      /tmp/kueue-day.json docs/images/kueue-day.png
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt


def draw(record: dict[str, Any], out: Path) -> None:
    steps = record["steps"]
    hours = [s["hour"] for s in steps]
    capacity = record["capacity"]
    fig, ax = plt.subplots(figsize=(9, 4.2), dpi=110)
    free_for_training = [capacity - s["serving_lead"] for s in steps]
    ax.step(hours, [s["serving_now"] for s in steps], where="post", label="serving runs (cpu)",
            color="tab:blue")  # fmt: skip
    ax.step(hours, free_for_training, where="post", linestyle=":", color="tab:blue",
            label="capacity - serving's need over the lead time")  # fmt: skip
    ax.step(hours, [s["written"] for s in steps], where="post", color="tab:orange",
            linewidth=2, label="nominalQuota written (cpu)")  # fmt: skip
    ax.step(hours, [s["admitted"] for s in steps], where="post", color="tab:green",
            label="admitted by Kueue (cpu)")  # fmt: skip
    ax.axhline(capacity, color="grey", linewidth=0.8, label=f"capacity {capacity:.0f} cpu")
    marked = False
    for s in steps:
        for _ in s["deactivated"]:
            ax.plot(s["hour"], s["admitted"], "rv", markersize=8,
                    label=None if marked else "preemption (workload evicted)")  # fmt: skip
            marked = True
    ax.set_xlabel("hour of the compressed day")
    ax.set_ylabel("cpu cores")
    ax.set_title(
        f"Quota lent to Kueue (measured, real Kueue v0.17): {record['preemptions']} "
        f"preemptions, {record['lost_pod_hours']:.1f} training pod-hours lost"
    )
    ax.legend(loc="upper center", fontsize=8, ncol=3)
    ax.set_ylim(0, capacity * 1.4)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out)


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: plot_kueue_day.py RECORD.json OUT.png", file=sys.stderr)
        return 2
    draw(json.loads(Path(argv[0]).read_text()), Path(argv[1]))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
