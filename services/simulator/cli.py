"""`tideshift simulate`: parse the flags, load the scenario and its traffic, run each policy,
print a table or JSON (and plots)."""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from tideshift.loadgen.core.profiles import RateProfile
from tideshift.services.planner.core.baselines import POLICIES
from tideshift.services.simulator.kueue_mode import run_kueue
from tideshift.services.simulator.oracle import ORACLE
from tideshift.services.simulator.report import format_table, plot, plot_jct
from tideshift.services.simulator.run import PolicyResult, compare_to_oracle, run_policy
from tideshift.services.simulator.scenario import (
    MAX_DURATION_S,
    Scenario,
    ScenarioError,
    load_scenario,
    trace_dir_override,
)

# The policies `simulate` runs: the planner's registry and the clairvoyant bound (oracle.py).
SIM_POLICIES = (*POLICIES, ORACLE)


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
        help=f"policy to run (repeatable; default all: {', '.join(SIM_POLICIES)}); the "
        f"{ORACLE} bound runs with any choice, for the fractions of its figures",
    )
    parser.add_argument(
        "--no-oracle",
        action="store_true",
        help=f"do not run the {ORACLE} bound unless asked for with --policy (no fractions)",
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
    parser.add_argument(
        "--training-through",
        choices=("tideshift", "kueue"),
        default="tideshift",
        help="kueue: also run the scenario's training through Kueue on quota Tideshift lends "
        "(modelled, simulator/kueue_mode.py) and print its figures beside the policies'",
    )
    return parser


def load_profiles(
    scenario: Scenario, scenario_path: Path, trace_dir: str | None
) -> list[RateProfile]:
    override = trace_dir_override(trace_dir)
    base = scenario_path.resolve().parent
    return [spec.traffic.profile(base, override) for spec in scenario.serving]


def _check_writable(parser: argparse.ArgumentParser, out: Path) -> None:
    """Fail before simulating, not after: a run can take minutes."""
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        parser.error(f"--out: expected a writable directory; {out}: {exc.strerror}")
    if not os.access(out, os.W_OK | os.X_OK):
        parser.error(f"--out: expected a writable directory; {out} is not writable")


def _finite(value: Any) -> Any:
    """JSON has no NaN: an undefined figure (e.g. a ratio over nothing) is written as null."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {key: _finite(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(item) for item in value]
    return value


def _plot_jct(
    results: list[PolicyResult], scenario: Scenario, out: Path | None, say: Callable[[str], None]
) -> None:
    """The policies' job completion times side by side, when asked for plots and jobs finish."""
    if out is not None and (path := plot_jct(results, scenario, out)) is not None:
        say(f"job completion time CDF: {path}")


def _policies(parser: argparse.ArgumentParser, args: argparse.Namespace) -> list[str]:
    """The policies to run, in order: those asked for (default all) and the oracle bound
    unless --no-oracle."""
    policies = list(dict.fromkeys(args.policies or SIM_POLICIES))
    for name in policies:
        if name not in SIM_POLICIES:
            parser.error(
                f"--policy: unknown policy {name!r}; expected one of {', '.join(SIM_POLICIES)}"
            )
    if ORACLE not in policies and not args.no_oracle:
        policies.append(ORACLE)
    return policies


def _kueue(
    args: argparse.Namespace,
    scenario: Scenario,
    profiles: list[RateProfile],
    say: Callable[[str], None],
) -> dict[str, Any] | None:
    """The figures of training through Kueue, when asked for (--training-through kueue)."""
    if args.training_through != "kueue":
        return None
    say(f"simulating {scenario.name} with training through Kueue ...")
    return run_kueue(scenario, profiles).summary()


def main(argv: Sequence[str]) -> int:
    parser = _parser()
    args = parser.parse_args(list(argv))
    policies = _policies(parser, args)
    if args.duration is not None and not 0 < args.duration <= MAX_DURATION_S:
        parser.error(f"--duration: expected seconds > 0 and <= {MAX_DURATION_S:.0f}")
    if args.out is not None:
        _check_writable(parser, args.out)
    try:
        scenario = load_scenario(args.scenario)
        if args.duration is not None:
            # Validated again, so the override meets the same bounds as the file's value.
            scenario = Scenario.model_validate(
                {**scenario.model_dump(), "duration_s": args.duration}
            )
        profiles = load_profiles(scenario, args.scenario, args.trace_dir)
    except ScenarioError as exc:
        print(f"tideshift simulate: {exc}", file=sys.stderr)
        return 2
    except ValidationError as exc:
        print(f"tideshift simulate: --duration: {exc.errors()[0]['msg']}", file=sys.stderr)
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
    compare_to_oracle(results)
    _plot_jct(results, scenario, args.out, progress)
    kueue = _kueue(args, scenario, profiles, progress)
    if args.json:
        document: dict[str, Any] = {"policies": {r.name: r.summary() for r in results}}
        if kueue is not None:
            document["kueue"] = kueue
        print(json.dumps(_finite(document), indent=2, allow_nan=False))
    else:
        print(f"scenario {scenario.name}: {scenario.duration_s:.0f} s simulated")
        print(format_table(results))
        if kueue is not None:
            print("training through Kueue (lent quota, whole jobs, preemption): " + ", ".join(
                f"{key} {value}" for key, value in kueue.items()))  # fmt: skip
    return 0
