"""Serving's trade-off where over-provisioning <= 1.5 is out of reach (issue 26): the priced
level serving is sized at (since issue 39 one level for the forecast and the rise, set by each
workload's `shortfall_price`: here the price that gives each workload that level,
serving/price.py `price_for`) against shortfall minutes, over-provisioning (mean ready
capacity / demand, per serving workload) and weighted training work, tideshift only, one
process per point.

`bench_serving_price.py` draws the same trade-off against the price itself and the oracle.

Run: .venv/bin/python tests/benchmarks/bench_rise_tradeoff.py [--only NAME ...]
     [--quantiles 0.95,0.98,0.99,0.995,0.999] [--duration 21600] [--jobs 2] [--out PNG]
About 30-90 s per point on a loaded machine at the default 6 h. Asserts nothing.
"""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path

from tideshift.services.planner.core import Decision, PlanInputs, PlanState
from tideshift.services.planner.core.baselines import POLICIES, TideshiftPolicy
from tideshift.services.planner.core.serving.price import price_for
from tideshift.services.simulator.cli import load_profiles
from tideshift.services.simulator.report import save_figure
from tideshift.services.simulator.run import run_policy
from tideshift.services.simulator.scenario import Scenario, load_scenario

SCENARIOS = Path(__file__).resolve().parents[2] / "loadgen" / "scenarios"
DEFAULT = ("finite-jobs-gpu", "family-steep-daily", "family-flash-crowds")
IMAGE = Path(__file__).resolve().parents[2] / "docs" / "images" / "rise-quantile-tradeoff.png"


class _PricedAt(TideshiftPolicy):
    """Tideshift with every serving workload sized at the level `quantile`."""

    quantile = 0.99

    def plan(self, inputs: PlanInputs, state: PlanState, now: float) -> tuple[Decision, PlanState]:
        serving = tuple(
            replace(w, shortfall_price=price_for(self.quantile, w.replica_requests[0]))
            for w in inputs.serving
        )
        return super().plan(replace(inputs, serving=serving), state, now)


@dataclass(frozen=True)
class Point:
    scenario: str
    quantile: float
    shortfall: float  # minutes
    work: float  # weighted training work
    over: dict[str, float]  # mean ready capacity / demand per serving workload
    churn: int


def point(name: str, quantile: float, duration: float) -> Point:
    """One point (a worker's task): the run's shortfall, work and over-provisioning."""
    path = SCENARIOS / f"{name}.yaml"
    document = load_scenario(path).model_dump()
    scenario = Scenario.model_validate({**document, "duration_s": duration})
    print(f"... {name}: rise at q{quantile}", file=sys.stderr, flush=True)
    _PricedAt.quantile = quantile
    POLICIES["tideshift"] = _PricedAt
    result = run_policy(scenario, load_profiles(scenario, path, None), "tideshift")
    return Point(
        scenario=name,
        quantile=quantile,
        shortfall=result.shortfall_minutes,
        work=result.weighted_work,
        over={k: v["mean"] for k, v in result.over_provisioning.items()},
        churn=result.trainer_churn,
    )


def draw(points: Sequence[Point], out: Path) -> Path:
    """Shortfall, over-provisioning (each workload) and work against the quantile."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(1, 3, figsize=(13, 4))
    for name in dict.fromkeys(p.scenario for p in points):
        mine = sorted((p for p in points if p.scenario == name), key=lambda p: p.quantile)
        xs = [p.quantile for p in mine]
        axes[0].plot(xs, [p.shortfall for p in mine], "o-", label=name)
        for workload in mine[0].over:
            ys = [p.over[workload] for p in mine]
            axes[1].plot(xs, ys, "o-", label=f"{name} / {workload}")
        axes[2].plot(xs, [p.work / mine[-1].work for p in mine], "o-", label=name)
    axes[1].axhline(1.5, color="grey", linestyle=":", label="goal 1.5")
    labels = ("shortfall minutes", "over-provisioning (mean)", "weighted work / highest q's")
    for axis, label in zip(axes, labels, strict=True):
        axis.set_xlabel("level serving is sized at (shortfall price's)")
        axis.set_ylabel(label)
        axis.legend(fontsize=7)
    figure.suptitle("The priced rise's quantile against shortfall, room and training work")
    return save_figure(figure, out)


def main(argv: Sequence[str] = ()) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--only", action="append", help="scenario name (repeatable)")
    parser.add_argument("--quantiles", default="0.95,0.98,0.99,0.995,0.999")
    parser.add_argument("--duration", type=float, default=21600.0)
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--out", type=Path, default=IMAGE)
    args = parser.parse_args(list(argv) or None)
    quantiles = [float(q) for q in args.quantiles.split(",")]
    tasks = [(name, q) for name in args.only or DEFAULT for q in quantiles]
    with ProcessPoolExecutor(args.jobs) as pool:
        futures = [pool.submit(point, name, q, args.duration) for name, q in tasks]
        points = [future.result() for future in futures]
    print(f"{'scenario':<22} {'rise q':>7} {'short min':>9} {'wtd work':>12} {'churn':>6}  over")
    for p in points:
        over = ", ".join(f"{k} {v:.2f}" for k, v in p.over.items() if math.isfinite(v))
        print(
            f"{p.scenario:<22} {p.quantile:>7g} {p.shortfall:>9.0f} "
            f"{p.work:>12,.0f} {p.churn:>6}  {over}"
        )
    print(f"PNG: {draw(points, args.out)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
