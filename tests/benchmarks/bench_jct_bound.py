"""How far below a static partition's mean JCT any policy can go on a stream of identical
finite jobs: the lower bound of services/simulator/jct_bound.py for a scenario (default
edl-training-only), beside the mean JCT and queueing of static, EDL-like and Tideshift
simulated in the same run, each as a ratio to the bound and static's JCT over it (issue 26
asks for 1.5x shorter than static; the bound says whether any policy can get there).

Run: .venv/bin/python tests/benchmarks/bench_jct_bound.py [scenario.yaml]. Asserts nothing."""

from __future__ import annotations

import sys
from pathlib import Path

from tideshift.services.simulator.jct_bound import mean_jct_lower_bound
from tideshift.services.simulator.run import run_policy
from tideshift.services.simulator.scenario import load_scenario

DEFAULT = Path(__file__).resolve().parents[2] / "loadgen/scenarios/edl-training-only.yaml"


def main(argv: list[str]) -> int:
    scenario = load_scenario(Path(argv[0]) if argv else DEFAULT)
    bound = mean_jct_lower_bound(scenario)
    print(f"{scenario.name}: one job alone at its maximum trainers {bound.alone_s:.1f} s")
    print(
        f"  the cluster does at most {bound.peak_rate:.1f} work/s "
        f"({bound.jobs_at_peak} jobs at once, equal sizes)"
    )
    spread = ", ".join(f"{n}: {rate:.4f}" for n, rate in bound.per_core.items())
    print(f"  work per core at n trainers (parameter servers shared): {spread}")
    print(f"  no policy's mean JCT is below {bound.mean_jct_s:.1f} s")
    rows = {}
    for policy in ("static", "edl", "tideshift"):
        summary = run_policy(scenario, [], policy).summary()
        rows[policy] = (summary["jobs"]["jct_s"]["mean"], summary["jobs"]["queueing_s"]["mean"])
    static_jct = rows["static"][0]
    print(f"  static / bound: {static_jct / bound.mean_jct_s:.3f}x (the most any policy gains)")
    print(f"  1.5x shorter than static: {static_jct / 1.5:.1f} s", end="")
    print(" (below the bound: out of reach)" if static_jct / 1.5 < bound.mean_jct_s else "")
    print(f"{'policy':<10} {'mean JCT s':>11} {'/ bound':>8} {'static /':>9} {'queueing s':>11}")
    for policy, (jct, queueing) in rows.items():
        print(
            f"{policy:<10} {jct:>11.1f} {jct / bound.mean_jct_s:>8.3f} "
            f"{static_jct / jct:>9.3f} {queueing:>11.1f}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
