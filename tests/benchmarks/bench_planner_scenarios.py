"""Policy outcomes: the three shipped scenarios x every policy, one run each.

Prints one table per scenario (the columns of `tideshift simulate`) and the issue's goals:
* edl-mixed-nginx: tideshift holds >= 95 % utilisation with zero serving shortfall;
* edl-training-only: tideshift's mean job pending time is lower than edl's;
* day-night-nasa: zero shortfall minutes while training gets >= 90 % of the capacity serving
  does not need.

Run: .venv/bin/python tests/benchmarks/bench_planner_scenarios.py [--out DIR] [--only NAME]
(takes minutes: the NASA day is simulated four times). Asserts nothing.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from tideshift.services.planner.baselines import POLICIES
from tideshift.services.simulator.cli import load_profiles
from tideshift.services.simulator.report import format_table, plot
from tideshift.services.simulator.run import PolicyResult, run_policy
from tideshift.services.simulator.scenario import load_scenario

SCENARIOS = Path(__file__).resolve().parents[2] / "loadgen" / "scenarios"
NAMES = ("edl-training-only", "edl-mixed-nginx", "day-night-nasa")


def goals(name: str, results: dict[str, PolicyResult]) -> list[str]:
    ours = results["tideshift"]
    if name == "edl-mixed-nginx":
        util = ours.utilization["cpu"]
        met = util >= 0.95 and ours.shortfall_minutes == 0
        return [
            f"goal util >= 95 % and zero shortfall: cpu {util:.1%}, shortfall minutes "
            f"{ours.shortfall_minutes} -> {'met' if met else 'NOT met'}"
        ]
    if name == "edl-training-only":
        edl = results["edl"].pending_mean_s
        met = ours.pending_mean_s < edl
        return [
            f"goal mean pending below edl: tideshift {ours.pending_mean_s:.1f} s vs edl "
            f"{edl:.1f} s -> {'met' if met else 'NOT met'}"
        ]
    share = ours.training_share_of_spare
    met = ours.shortfall_minutes == 0 and share >= 0.9
    return [
        f"goal zero shortfall minutes and >= 90 % of spare to training: shortfall minutes "
        f"{ours.shortfall_minutes}, training share of spare cpu {share:.1%} -> "
        f"{'met' if met else 'NOT met'}"
    ]


def main(argv: Sequence[str] = ()) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", type=Path, help="also write the PNG plots here")
    parser.add_argument("--only", choices=NAMES, action="append", help="run only these")
    args = parser.parse_args(list(argv))
    for name in args.only or NAMES:
        path = SCENARIOS / f"{name}.yaml"
        scenario = load_scenario(path)
        profiles = load_profiles(scenario, path, None)
        results = {}
        for policy in POLICIES:
            print(f"... {name}: {policy}", file=sys.stderr, flush=True)
            results[policy] = run_policy(scenario, profiles, policy)
            if args.out is not None:
                plot(results[policy], scenario, args.out)
        print(f"\n## {name} ({scenario.duration_s:.0f} s simulated)")
        print(format_table(list(results.values())))
        for line in goals(name, results):
            print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
