"""The serving price's trade-off curve (issue 39, item 3): tideshift at each shortfall price
(every serving workload's `shortfall_price`, core-hours of training per replica-minute of
unserved demand, services/planner/core/serving/price.py) on each family, against the oracle
bound run beside it: shortfall minutes and training work / the oracle's, per price. Prints the
table and draws both curves in one PNG (a line per family).

Run (the docs' figure, docs/images/serving-price-tradeoff.png):
     OPENBLAS_NUM_THREADS=1 .venv/bin/python tests/benchmarks/bench_serving_price.py \\
       --duration 3600 --jobs 2 --out docs/images
Defaults: heldout-jittered-spikes (held out) and family-periodic-spikes (tuned), prices
0.02, 0.2, 2 and 10 (the default). Each point is one simulated run of tideshift; the oracle
once per family. Asserts nothing.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from collections.abc import Sequence
from concurrent.futures import Future, ProcessPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from tests.benchmarks.bench_planner_scenarios import NAMES, run_one, sweep_point  # noqa: E402
from tideshift.services.simulator.oracle import ORACLE  # noqa: E402
from tideshift.services.simulator.report import save_figure  # noqa: E402

FAMILIES = ("heldout-jittered-spikes", "family-periodic-spikes")
PRICES = (0.02, 0.2, 2.0, 10.0)
FIGURE = "serving-price-tradeoff.png"


def draw(curves: dict[str, list[tuple[float, int, float]]], out: Path) -> Path:
    """Shortfall minutes and work / oracle against the price, a line per family."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, (short_axis, work_axis) = plt.subplots(1, 2, figsize=(10, 4))
    for name, points in sorted(curves.items()):
        prices = [price for price, _, _ in points]
        short_axis.plot(prices, [short for _, short, _ in points], "o-", label=name)
        work_axis.plot(prices, [work for _, _, work in points], "o-", label=name)
    short_axis.set_ylabel("shortfall minutes")
    work_axis.set_ylabel("training work / oracle's")
    for axis in (short_axis, work_axis):
        axis.set_xscale("log")
        axis.set_xlabel("shortfall price (core-hours per replica-minute unserved)")
        axis.grid(alpha=0.3)
    work_axis.legend(fontsize=8)
    figure.suptitle("Serving's price: shortfall against training work (measured, tideshift)")
    figure.tight_layout()
    return save_figure(figure, out / FIGURE)


def main(argv: Sequence[str] = ()) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--families", default=",".join(FAMILIES), help="comma-separated")
    parser.add_argument("--prices", default=",".join(f"{p:g}" for p in PRICES))
    parser.add_argument("--duration", type=float, help="simulate this many seconds of each")
    parser.add_argument("--jobs", type=int, default=1, help="runs in parallel processes")
    parser.add_argument("--out", type=Path, required=True, help="directory of the PNG")
    args = parser.parse_args(list(argv))
    families = args.families.split(",")
    if unknown := set(families) - set(NAMES):
        parser.error(f"--families: no such scenario: {', '.join(sorted(unknown))}")
    prices = sorted(float(p) for p in args.prices.split(","))
    started = time.perf_counter()
    with ProcessPoolExecutor(max_workers=args.jobs) as pool:
        oracles = {n: pool.submit(run_one, n, ORACLE, args.duration, None) for n in families}
        points: dict[str, list[Future[tuple[float, ...]]]] = {
            n: [pool.submit(sweep_point, n, p, args.duration) for p in prices] for n in families
        }
        curves: dict[str, list[tuple[float, int, float]]] = {}
        print(f"{'family':<28} {'price':>7} {'short min':>9} {'work/oracle':>11} {'churn':>6}")
        for name in families:
            oracle_work = oracles[name].result().training_work
            curves[name] = []
            for future in points[name]:
                price, short, _, _, churn, work = future.result()
                ratio = work / oracle_work if oracle_work > 0 else math.nan
                curves[name].append((price, int(short), ratio))
                print(f"{name:<28} {price:>7g} {short:>9.0f} {ratio:>11.3f} {churn:>6.0f}")
    print(f"plot: {draw(curves, args.out)}")
    print(f"benchmark runtime: {time.perf_counter() - started:.0f} s wall")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
