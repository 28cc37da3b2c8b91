"""Policy outcomes: every shipped scenario (loadgen/scenarios, the issue-26 families and the
finite job stream among them) x every policy, in one run, and issue 26's goals per scenario:

* 0 shortfall minutes (tideshift);
* training work >= edl's (work weighted by the trainer's dominant share, `measures.py`;
  plain progress units printed beside it);
* trainer churn <= edl's;
* over-provisioning (mean ready capacity / demand, worst serving workload) <= 1.5;
* with finite jobs (`work:`): mean JCT <= edl's and >= 1.5x shorter than static's (Lyra's
  1.48x), mean queueing likewise (unfinished jobs count up to the end of the run);
* against the clairvoyant bound (issue 39, `services/simulator/oracle.py`, run beside the
  others): training work >= 0.90 of the oracle's, trainer churn <= 1.2x the oracle's.

At the end, per scenario, tuned and held-out apart (each scenario's `evaluation:`; the
held-out ones are `heldout-*.yaml`): tideshift's shortfall minutes, work / oracle, churn /
oracle, serving replica-hours / oracle's, and the over-provisioning against the reachable
minimum (serving replica-hours / the whole replicas each step's demand needs at the target
utilisation), with EDL-like's work and churn / oracle and the oracle's own over-provisioning
beside them.

`--sweep P1,P2,...` also runs tideshift at each shortfall price (every serving workload's
`shortfall_price`, serving/price.py) on each scenario, prints shortfall minutes, weighted work,
over-provisioning and churn per price and draws them against the price in
DIR/<scenario>-price-sweep.png (needs --out); `tests/benchmarks/bench_serving_price.py` draws
the docs' curve against the oracle. `--policies` runs a subset, `--without onsets,wave`
switches serving rules off (what each buys), `--json PATH` keeps every summary; each
scenario's table has the job-hours jobs were left behind (at zero trainers while their fair
share was positive, `services/simulator/core/fair_share.py`).

Run: .venv/bin/python tests/benchmarks/bench_planner_scenarios.py [--out DIR] [--only NAME]
     [--duration S] [--sweep 0.05,0.5,2,10,100] [--jobs N] [--policies tideshift,edl,oracle]
     [--without onsets,wave] [--json PATH]
Full run (every scenario, two days each, all policies and the oracle: hours on two cores):
     nice .venv/bin/python tests/benchmarks/bench_planner_scenarios.py --jobs 2
Runtime: about 1 ms per simulated step per policy on a quiet core, so a two-day scenario at
10 s steps is about 20 s per policy quiet and several minutes on a loaded machine; all
scenarios x 4 policies is tens of minutes (it prints each scenario's and its own wall time).
`--jobs N` runs that many policy runs in parallel processes, shortest scenarios first (under
`nice` on a shared machine, several processes get more of the cores than one). `--duration` trims
every scenario (the job streams are then cut short too). Asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import replace
from pathlib import Path

from tideshift.loadgen.core.profiles import RateProfile
from tideshift.services.planner.core import Decision, PlanInputs, PlanState
from tideshift.services.planner.core.baselines import POLICIES, TideshiftPolicy
from tideshift.services.simulator.cli import load_profiles
from tideshift.services.simulator.core import measures as msr
from tideshift.services.simulator.oracle import ORACLE
from tideshift.services.simulator.report import format_table, plot, plot_jct, save_figure
from tideshift.services.simulator.run import PolicyResult, compare_to_oracle, run_policy
from tideshift.services.simulator.scenario import Scenario, load_scenario

SCENARIOS = Path(__file__).resolve().parents[2] / "loadgen" / "scenarios"
NAMES = tuple(sorted(path.stem for path in SCENARIOS.glob("*.yaml")))
LYRA_RATIO = 1.5
# The policies run on each scenario: the registry's and the clairvoyant bound.
BENCH_POLICIES = (*POLICIES, ORACLE)
ORACLE_WORK, ORACLE_CHURN = 0.90, 1.2


def _verdict(met: bool) -> str:
    return "met" if met else "NOT met"


def goals(results: dict[str, PolicyResult]) -> list[tuple[str, str, bool]]:
    """(goal, the numbers, met) for tideshift against edl and static in the same run (the
    comparisons with a policy `--policies` left out are skipped)."""
    if "tideshift" not in results:
        return []
    ours = results["tideshift"]
    # Absent policies compare as tideshift itself (met); their rows are dropped below.
    edl, static = results.get("edl", ours), results.get("static", ours)
    means = [s["mean"] for s in ours.over_provisioning.values() if math.isfinite(s["mean"])]
    over = f"{max(means):.2f}" if means else "- (no serving demand)"
    rows = [
        ("0 shortfall minutes", f"{ours.shortfall_minutes}", ours.shortfall_minutes == 0),
        (
            "weighted work >= edl",
            f"{ours.weighted_work:.0f} vs {edl.weighted_work:.0f} "
            f"({ours.weighted_work / max(edl.weighted_work, 1e-9):.2f}x; plain "
            f"{ours.training_work / max(edl.training_work, 1e-9):.2f}x)",
            ours.weighted_work >= edl.weighted_work,
        ),
        (
            "churn <= edl",
            f"{ours.trainer_churn} vs {edl.trainer_churn}",
            ours.trainer_churn <= edl.trainer_churn,
        ),
        ("over-provisioning <= 1.5", over, max(means, default=0.0) <= 1.5),
        (
            "0 job-hours left behind",
            f"{ours.job_hours_left_behind:.3f}",
            ours.job_hours_left_behind == 0,
        ),
    ]
    if "edl" not in results:
        rows = [row for row in rows if "edl" not in row[0]]
    if ours.vs_oracle:
        work = ours.vs_oracle["training_work_vs_oracle"]
        churn = ours.vs_oracle["churn_vs_oracle"]
        rows += [
            (f"work >= {ORACLE_WORK:.2f} oracle", f"{work:.3f}", work >= ORACLE_WORK),
            (f"churn <= {ORACLE_CHURN:.1f}x oracle", f"{churn:.2f}", churn <= ORACLE_CHURN),
        ]
    jobs_finished = any(o.finished_at is not None for r in results.values() for o in r.job_outcomes)
    if jobs_finished and "edl" in results and "static" in results:
        for key, label in (("jct_s", "mean JCT"), ("queueing_s", "mean queueing")):
            mine, theirs, base = (
                msr.job_times(r.job_outcomes, r.end_s)[key]["mean"] for r in (ours, edl, static)
            )
            rows.append((f"{label} <= edl", f"{mine:.0f} s vs {theirs:.0f} s", mine <= theirs))
            speedup = base / max(mine, 1e-9)
            rows.append(
                (
                    f"{label} >= {LYRA_RATIO}x shorter than static",
                    f"{base:.0f} s / {mine:.0f} s = {speedup:.2f}x",
                    speedup >= LYRA_RATIO,
                )
            )
    return rows


def _with(scenario: Scenario, *, duration: float | None) -> Scenario:
    document = scenario.model_dump()
    if duration is not None:
        document["duration_s"] = duration
    return Scenario.model_validate(document)


class _Priced(TideshiftPolicy):
    """Tideshift with every serving workload's `shortfall_price` at `price` (core-hours per
    replica-minute unserved, serving/price.py), for the sweep."""

    price = 10.0

    def plan(self, inputs: PlanInputs, state: PlanState, now: float) -> tuple[Decision, PlanState]:
        serving = tuple(replace(w, shortfall_price=self.price) for w in inputs.serving)
        return super().plan(replace(inputs, serving=serving), state, now)


def without(rules: Sequence[str]) -> None:
    """Switch serving rules off in this process (and the workers it forks), to measure what
    each buys: `onsets` (recurring onsets priced when due), `wave` (in a panic, the rise just
    seen)."""
    from tideshift.services.planner.core.serving import headroom

    for rule in rules:
        if rule == "onsets":
            headroom.recurrence = lambda rises, level: None  # type: ignore[assignment]
        elif rule == "wave":
            headroom.recent_rise = lambda rises, **_: 1.0  # type: ignore[assignment]
        else:
            raise SystemExit(f"--without: expected onsets or wave, got {rule!r}")


def sweep_point(name: str, price: float, duration: float | None) -> tuple[float, ...]:
    """One point of the curve (a worker's task): tideshift with every serving workload's
    shortfall price at `price`; (price, shortfall minutes, weighted work, worst mean
    over-provisioning, churn, training work)."""
    path = SCENARIOS / f"{name}.yaml"
    scenario = _with(load_scenario(path), duration=duration)
    print(f"... {name}: tideshift at price {price}", file=sys.stderr, flush=True)
    _Priced.price = price
    # run_policy builds its policy from the registry by name ("tideshift" lends batch room).
    POLICIES["tideshift"] = _Priced
    try:
        result = run_policy(scenario, load_profiles(scenario, path, None), "tideshift")
    finally:
        POLICIES["tideshift"] = TideshiftPolicy
    means = [s["mean"] for s in result.over_provisioning.values() if math.isfinite(s["mean"])]
    return (
        price,
        result.shortfall_minutes,
        result.weighted_work,
        max(means, default=math.nan),
        result.trainer_churn,
        result.training_work,
    )


def sweep_plot(name: str, points: Sequence[tuple[float, ...]], out: Path) -> Path:
    """The sweep's table, printed, and its four curves against the price in one PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    points = sorted(points)
    print(f"\n## {name}: price sweep (tideshift)")
    print(f"{'price':>8} {'short min':>9} {'wtd work':>12} {'over-prov':>9} {'churn':>6}")
    for price, short, work, over, churn, _ in points:
        print(f"{price:>8g} {short:>9.0f} {work:>12.0f} {over:>9.2f} {churn:>6.0f}")
    figure, axes = plt.subplots(2, 2, figsize=(9, 6), sharex=True)
    labels = ("shortfall minutes", "weighted training work", "over-provisioning", "churn")
    for column, (axis, label) in enumerate(zip(axes.flat, labels, strict=True), start=1):
        axis.plot([p[0] for p in points], [p[column] for p in points], "o-")
        axis.set_ylabel(label)
    for axis in axes[1]:
        axis.set_xlabel("shortfall price (core-hours per replica-minute)")
        axis.set_xscale("log")
    figure.suptitle(f"{name}: shortfall price against shortfall, work, room and churn")
    figure.tight_layout()
    return save_figure(figure, out / f"{name}-price-sweep.png")


def _scenario(name: str, duration: float | None) -> tuple[Scenario, list[RateProfile]]:
    path = SCENARIOS / f"{name}.yaml"
    scenario = _with(load_scenario(path), duration=duration)
    return scenario, load_profiles(scenario, path, None)


def run_one(name: str, policy: str, duration: float | None, out: Path | None) -> PolicyResult:
    """One policy on one scenario (one worker's task); its plots when `out` is given."""
    scenario, profiles = _scenario(name, duration)
    print(f"... {name}: {policy}", file=sys.stderr, flush=True)
    result = run_policy(scenario, profiles, policy)
    if out is not None:
        plot(result, scenario, out)
    return result


def report(
    name: str, results: dict[str, PolicyResult], duration: float | None, out: Path | None
) -> list[tuple[str, str, bool]]:
    """One scenario's tables and goals, printed; returns the goals."""
    scenario, _ = _scenario(name, duration)
    if out is not None:
        plot_jct(list(results.values()), scenario, out)
    print(f"\n## {name} ({scenario.duration_s:.0f} s simulated)")
    print(format_table(list(results.values())))
    rows = goals(results)
    print(f"\n{'goal':<40} {'numbers':<45} verdict")
    for goal, numbers, met in rows:
        print(f"{goal:<40} {numbers:<45} {_verdict(met)}")
    spent = sum(result.wall_s for result in results.values())
    print(f"({name}: {spent:.0f} s wall over its {len(results)} policies)", flush=True)
    return rows


def oracle_table(versus: dict[str, dict[str, PolicyResult]]) -> str:
    """Per scenario, tuned and held-out apart: tideshift's shortfall and its figures against
    the oracle's, EDL-like's beside them."""
    header = (
        f"{'scenario':<28} {'short min':>9} {'work/oracle':>11} {'churn/oracle':>12} "
        f"{'rep-h/oracle':>12} {'over min':>8} {'edl work/or':>11} {'edl churn/or':>12} "
        f"{'oracle short':>12} {'oracle over min':>15} {'left job-h':>10}"
    )
    lines = ["\n## tideshift against the oracle bound, per scenario"]
    # The scenario files only: their traffic (a trace, a week of a family) is not needed here.
    marks = {name: load_scenario(SCENARIOS / f"{name}.yaml").evaluation for name in versus}
    for kind in ("tuned", "held-out"):
        names = [n for n in sorted(versus) if marks[n] == kind]
        lines += [f"\n### {kind}", header, "-" * len(header)]
        for name in names:
            if ORACLE not in versus[name] or "tideshift" not in versus[name]:
                continue
            ours, oracle = versus[name]["tideshift"], versus[name][ORACLE]
            edl = versus[name].get("edl", oracle)  # without edl: its columns read 1
            lines.append(
                f"{name:<28} {ours.shortfall_minutes:>9d} "
                f"{ours.vs_oracle['training_work_vs_oracle']:>11.3f} "
                f"{ours.vs_oracle['churn_vs_oracle']:>12.2f} "
                f"{ours.vs_oracle['serving_replica_hours_vs_oracle']:>12.2f} "
                f"{ours.over_minimum:>8.2f} "
                f"{edl.vs_oracle['training_work_vs_oracle']:>11.3f} "
                f"{edl.vs_oracle['churn_vs_oracle']:>12.2f} {oracle.shortfall_minutes:>12d} "
                f"{oracle.over_minimum:>15.2f} {ours.job_hours_left_behind:>10.2f}"
            )
    return "\n".join(lines)


def main(argv: Sequence[str] = ()) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", type=Path, help="also write the PNG plots here")
    parser.add_argument("--only", choices=NAMES, action="append", help="run only these")
    parser.add_argument("--duration", type=float, help="simulate this many seconds of each")
    parser.add_argument("--sweep", help="shortfall prices, e.g. 0.05,0.5,2,10,100")
    parser.add_argument("--jobs", type=int, default=1, help="policy runs in parallel processes")
    parser.add_argument(
        "--policies",
        help=f"run only these, comma-separated (default: {','.join(BENCH_POLICIES)})",
    )
    parser.add_argument("--without", help="serving rules switched off: onsets, wave")
    parser.add_argument("--json", type=Path, help="also write each run's summary here")
    args = parser.parse_args(list(argv))
    policies = tuple(args.policies.split(",")) if args.policies else BENCH_POLICIES
    if unknown := set(policies) - set(BENCH_POLICIES):
        parser.error(f"--policies: expected some of {', '.join(BENCH_POLICIES)}, got {unknown}")
    if args.without:
        without(args.without.split(","))
    if args.sweep and args.out is None:
        parser.error("--sweep: needs --out DIR for the PNG")
    started = time.perf_counter()
    names = args.only or NAMES
    # The shortest scenarios first: a run cut short has shown the most scenarios.
    tasks = sorted(
        ((name, policy) for name in names for policy in policies),
        key=lambda task: load_scenario(SCENARIOS / f"{task[0]}.yaml").duration_s,
    )
    summary = {}
    versus: dict[str, dict[str, PolicyResult]] = {}
    with ProcessPoolExecutor(max_workers=args.jobs) as pool:
        runs = {pool.submit(run_one, *task, args.duration, args.out): task for task in tasks}
        done: dict[str, dict[str, PolicyResult]] = {name: {} for name in names}
        for finished in as_completed(runs):  # each scenario printed once its runs are done
            name, policy = runs[finished]
            done[name][policy] = finished.result()
            if len(done[name]) == len(policies):
                results = {policy: done[name][policy] for policy in policies}
                compare_to_oracle(list(results.values()))
                summary[name] = report(name, results, args.duration, args.out)
                versus[name] = results
    prices = [float(p) for p in args.sweep.split(",")] if args.sweep else []
    with ProcessPoolExecutor(max_workers=args.jobs) as pool:
        for name in names if prices else ():
            curve = [pool.submit(sweep_point, name, p, args.duration) for p in prices]
            points = [point.result() for point in curve]
            print(f"sweep plot: {sweep_plot(name, points, args.out)}", flush=True)
    print(f"\n## goals, every scenario\n{'scenario':<24} {'goal':<40} {'numbers':<45} verdict")
    for name in names:
        for goal, numbers, met in summary.get(name, ()):
            print(f"{name:<24} {goal:<40} {numbers:<45} {_verdict(met)}")
    print(oracle_table(versus))
    if args.json is not None:
        marks = {name: load_scenario(SCENARIOS / f"{name}.yaml").evaluation for name in versus}
        document = {
            name: {"evaluation": marks[name]}
            | {policy: result.summary() for policy, result in results.items()}
            for name, results in versus.items()
        }
        args.json.write_text(json.dumps(document, indent=1, default=str))
    print(f"\nbenchmark runtime: {time.perf_counter() - started:.0f} s wall")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
