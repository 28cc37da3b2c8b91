"""Where serving's over-provisioning comes from (issue 26), per serving workload: Tideshift's
mean ready capacity / demand (the goal's measure, <= 1.5) beside the *reachable minimum*, what
a policy that knew demand exactly would show with the user's own floor (`min_replicas`), whole
replicas and target utilisation, so a reader sees which part is policy and which the user's
settings.

Replica-hours, per workload, split as `tideshift simulate` splits a plan's replicas
(`forecast`, `rise`, `observed`, `held`: see services/simulator/core/measures.py), beside what exact
demand needs: `exact` whole replicas at the target utilisation, and `floor` what
`min_replicas` adds to them. `held` is what the plan kept above its three parts: the floor,
the stabilisation window, the panic window and the release horizon's median.

Run: .venv/bin/python tests/benchmarks/bench_serving_waste.py [--only NAME ...]
     [--duration S] [--policy tideshift]
Asserts nothing; about a minute per two-day scenario on a loaded machine.
"""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from tideshift.loadgen.core.profiles import RateProfile
from tideshift.services.simulator.cli import load_profiles
from tideshift.services.simulator.run import run_policy
from tideshift.services.simulator.scenario import Scenario, ServingSpec, load_scenario
from tideshift.services.simulator.world import serving_need

SCENARIOS = Path(__file__).resolve().parents[2] / "loadgen" / "scenarios"
DEFAULT = ("finite-jobs-gpu", "family-flash-crowds", "family-steep-daily")


@dataclass(frozen=True)
class Reachable:
    """What exact demand needs, over the steps with demand (as the goal's measure counts)."""

    ratio_mean: float  # ready capacity / demand with the floor, whole replicas, utilisation
    unfloored_mean: float  # the same without `min_replicas`
    exact_h: float  # replica-hours of whole replicas at the target utilisation, no floor
    floor_h: float  # replica-hours `min_replicas` adds to them


def reachable(spec: ServingSpec, profile: RateProfile, scenario: Scenario) -> Reachable:
    """The minimum a policy that knew `profile`'s demand exactly could reach."""
    times = np.arange(0.0, scenario.duration_s, scenario.step_s)
    demands = np.array([profile.rate(float(t)) for t in times], dtype=np.float64)
    unit = spec.capacity_rps * spec.target_utilization
    exact = np.minimum(np.ceil(demands / unit - 1e-9), spec.max_replicas)
    floored = np.array([serving_need(spec, float(d)) for d in demands], dtype=np.float64)
    served = demands > 1e-9
    hours = scenario.step_s / 3600.0
    return Reachable(
        ratio_mean=float(np.mean(floored[served] * spec.capacity_rps / demands[served])),
        unfloored_mean=float(np.mean(exact[served] * spec.capacity_rps / demands[served])),
        exact_h=float(exact.sum() * hours),
        floor_h=float((floored - exact).sum() * hours),
    )


def report(name: str, duration: float | None, policy: str) -> None:
    path = SCENARIOS / f"{name}.yaml"
    scenario = load_scenario(path)
    if duration is not None:
        scenario = Scenario.model_validate({**scenario.model_dump(), "duration_s": duration})
    profiles = load_profiles(scenario, path, None)
    print(f"... {name}: {policy}", file=sys.stderr, flush=True)
    result = run_policy(scenario, profiles, policy)
    print(
        f"\n## {name} ({scenario.duration_s:.0f} s), {policy}: shortfall "
        f"{result.shortfall_minutes} min, weighted work {result.weighted_work:.0f}, "
        f"churn {result.trainer_churn}"
    )
    header = (
        f"{'serving':<8} {'over-prov':>9} {'reachable':>9} {'no floor':>8} {'exact h':>8} "
        f"{'floor h':>8} {'plan h':>8} {'forecast h':>10} {'rise h':>8} {'observed h':>10} "
        f"{'held h':>8}"
    )
    print(header)
    print("-" * len(header))
    for spec, profile in zip(scenario.serving, profiles, strict=True):
        best = reachable(spec, profile, scenario)
        spread = result.over_provisioning.get(spec.name, {"mean": math.nan, "replica_h": {}})
        parts = spread["replica_h"]
        print(
            f"{spec.name:<8} {spread['mean']:>9.2f} {best.ratio_mean:>9.2f} "
            f"{best.unfloored_mean:>8.2f} {best.exact_h:>8.1f} {best.floor_h:>8.1f} "
            f"{sum(parts.values()):>8.1f} {parts.get('forecast', 0):>10.1f} "
            f"{parts.get('rise', 0):>8.1f} {parts.get('observed', 0):>10.1f} "
            f"{parts.get('held', 0):>8.1f}"
        )


def main(argv: Sequence[str] = ()) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    names = tuple(sorted(path.stem for path in SCENARIOS.glob("*.yaml")))
    parser.add_argument("--only", choices=names, action="append", help="these scenarios")
    parser.add_argument("--duration", type=float, help="simulate this many seconds of each")
    parser.add_argument("--policy", default="tideshift")
    args = parser.parse_args(list(argv))
    for name in args.only or DEFAULT:
        report(name, args.duration, args.policy)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
