"""`tideshift simulate`: parse the flags, load the scenario and its traffic, run each policy,
print a table or JSON (and plots)."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path

from tideshift.loadgen.profiles import RateProfile
from tideshift.services.planner.baselines import POLICIES
from tideshift.services.simulator.report import format_table, plot
from tideshift.services.simulator.run import run_policy
from tideshift.services.simulator.scenario import (
    Scenario,
    ScenarioError,
    load_scenario,
    trace_dir_override,
)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="tideshift simulate",
        description="Run capacity policies side by side on the simulated cluster.",
    )
    parser.add_argument("--scenario", required=True, type=Path, help="scenario YAML file")
    parser.add_argument(
        "--policy",
        action="append",
        dest="policies",
        metavar="NAME",
        help=f"policy to run (repeatable; default all: {', '.join(POLICIES)})",
    )
    parser.add_argument("--out", type=Path, help="directory for one PNG plot per policy")
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    parser.add_argument(
        "--trace-dir",
        help="directory holding the scenario's trace files (default: the path in the "
        "scenario, relative to it; env TIDESHIFT_TRACE_DIR)",
    )
    parser.add_argument(
        "--duration", type=float, help="override the scenario's duration_s (seconds, > 0)"
    )
    return parser


def load_profiles(
    scenario: Scenario, scenario_path: Path, trace_dir: str | None
) -> list[RateProfile]:
    override = trace_dir_override(trace_dir)
    base = scenario_path.resolve().parent
    return [spec.traffic.profile(base, override) for spec in scenario.serving]


def main(argv: Sequence[str]) -> int:
    parser = _parser()
    args = parser.parse_args(list(argv))
    policies = args.policies or list(POLICIES)
    for name in policies:
        if name not in POLICIES:
            parser.error(
                f"--policy: unknown policy {name!r}; expected one of {', '.join(POLICIES)}"
            )
    if args.duration is not None and args.duration <= 0:
        parser.error("--duration: expected seconds > 0")
    try:
        scenario = load_scenario(args.scenario)
        if args.duration is not None:
            scenario = scenario.model_copy(update={"duration_s": args.duration})
        profiles = load_profiles(scenario, args.scenario, args.trace_dir)
    except ScenarioError as exc:
        print(f"tideshift simulate: {exc}", file=sys.stderr)
        return 2

    def progress(message: str) -> None:
        print(message, file=sys.stderr, flush=True)

    results = []
    for name in policies:
        progress(f"simulating {scenario.name} with {name} ...")
        result = run_policy(scenario, profiles, name, progress=progress)
        progress(f"{name}: done in {result.wall_s:.1f} s")
        results.append(result)
        if args.out is not None:
            progress(f"{name}: plot {plot(result, scenario, args.out)}")
    if args.json:
        print(json.dumps({"policies": {r.name: r.summary() for r in results}}, indent=2))
    else:
        print(f"scenario {scenario.name}: {scenario.duration_s:.0f} s simulated")
        print(format_table(results))
    return 0
