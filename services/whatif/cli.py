"""`tideshift trace export` and `tideshift whatif`: a cluster's own history, replayed.

    tideshift trace export --prometheus URL --query PROMQL --since 14d --step 1m --out web.csv
    tideshift whatif --prometheus URL [--kubeconfig PATH] [--since 14d] [--out DIR]

Progress goes to stderr; a bad flag, an unreachable Prometheus or cluster, or a history with
no samples exits 2 with one line saying what to do next.
"""

from __future__ import annotations

import argparse
import asyncio
import string
import sys
import time
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import yaml
from prometheus_api_client import PrometheusConnect
from pydantic import ValidationError

from tideshift.events import WorkloadChanged, WorkloadRef
from tideshift.services.cluster.connect import open_kubernetes
from tideshift.services.cluster.port import Node
from tideshift.services.planner.core.baselines import POLICIES
from tideshift.services.predictor.core.evaluation import parse_duration
from tideshift.services.predictor.settings import DEFAULT_QUERY
from tideshift.services.simulator.report import format_table, plot
from tideshift.services.simulator.run import PolicyResult, run_policy
from tideshift.services.simulator.scenario import Scenario, ScenarioError
from tideshift.services.watcher.core.annotations import InvalidPolicy, workload_event
from tideshift.services.whatif.export import (
    ExportError,
    History,
    describe_gaps,
    fetch,
    write_trace,
)
from tideshift.services.whatif.scenario import Replay, build_scenario, unique_names


class Failure(Exception):
    """One line for the user, after `tideshift <command>: `; exit 2."""


def say(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def _duration(text: str) -> float:
    try:
        return parse_duration(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def _history(prometheus: str, query: str, *, since_s: float, step_s: float) -> History:
    """The query's last `since_s` seconds; Prometheus's errors become a `Failure`."""
    end = time.time()
    try:
        source = PrometheusConnect(url=prometheus, disable_ssl=False, timeout=60)
        return fetch(source, query, start=end - since_s, end=end, step_s=step_s, progress=say)
    except ExportError:
        raise
    except Exception as error:  # requests' connection errors, HTTP errors with the body
        first = str(error).splitlines()[0] if str(error) else type(error).__name__
        raise Failure(
            f"cannot query Prometheus at {prometheus}: {first[:300]}; check --prometheus and "
            "that the query runs in its graph page"
        ) from None


def _report_gaps(history: History, what: str) -> None:
    if history.gaps:
        share = history.missing_steps / history.rates.size
        say(f"{what}: {history.missing_steps} of {history.rates.size} steps missing ({share:.1%})")
        for line in describe_gaps(history):
            say(f"  {line}")


def trace_main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="tideshift trace export",
        description="Write a Prometheus query's history (requests/s) as a trace CSV "
        "that `tideshift simulate` replays.",
    )
    parser.add_argument("action", choices=["export"])
    parser.add_argument("--prometheus", required=True, help="Prometheus base URL")
    parser.add_argument("--query", required=True, help="PromQL giving one series of requests/s")
    parser.add_argument("--since", type=_duration, default="14d", help="e.g. 14d")
    parser.add_argument("--step", type=_duration, default="1m", help="e.g. 1m")
    parser.add_argument("--out", type=Path, required=True, help="CSV file to write")
    args = parser.parse_args(list(argv))
    try:
        history = _history(args.prometheus, args.query, since_s=args.since, step_s=args.step)
        _report_gaps(history, str(args.out))
        write_trace(history, args.out)
    except (Failure, ExportError) as error:
        print(f"tideshift trace export: {error}", file=sys.stderr)
        return 2
    start = datetime.fromtimestamp(history.start, UTC)
    steps = f"{history.rates.size} steps of {args.step:g} s"
    say(f"wrote {args.out}: {steps} from {start:%Y-%m-%d %H:%M} UTC")
    return 0


def _whatif_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="tideshift whatif",
        description="What Tideshift would have done on your cluster's history: a scenario from "
        "the live cluster (nodes, labelled workloads, their demand queries' history), run "
        "against the baseline policies.",
    )
    parser.add_argument("--prometheus", required=True, help="Prometheus base URL")
    parser.add_argument("--kubeconfig", help="default: $KUBECONFIG, ~/.kube/config, in-cluster")
    parser.add_argument("--context", help="kubeconfig context")
    parser.add_argument("--namespace", help="only this namespace's labelled workloads")
    parser.add_argument("--since", default="14d", help="window replayed (default 14d)")
    parser.add_argument(
        "--history", default="1d", help="history before it the forecaster fits on (default 1d)"
    )
    parser.add_argument("--step", default="1m", help="query step and plan interval (default 1m)")
    parser.add_argument("--model", help="forecasting model (default: the predictor's)")
    parser.add_argument(
        "--policy",
        action="append",
        dest="policies",
        choices=list(POLICIES),
        help=f"repeatable; default all: {', '.join(POLICIES)}",
    )
    parser.add_argument(
        "--query-template",
        default=DEFAULT_QUERY,
        help="demand of workloads without tideshift.io/demand-query ($name, $namespace)",
    )
    parser.add_argument("--out", type=Path, default=Path("whatif-out"), help="traces and plots")
    return parser


async def _read_cluster(args: argparse.Namespace) -> tuple[list[Node], list[WorkloadChanged]]:
    try:
        port = await open_kubernetes(
            args.kubeconfig, context=args.context, namespace=args.namespace
        )
        try:
            nodes, workloads = await port.list_nodes(), await port.list_workloads()
        finally:
            await port.close()
    except Exception as error:  # the Kubernetes client's config and API errors
        first = str(error).splitlines()[0] if str(error) else type(error).__name__
        raise Failure(
            f"cannot read the cluster: {first[:300]}; check --kubeconfig and --context"
        ) from None
    now = datetime.now(UTC)
    events = []
    for workload in workloads:
        try:
            events.append(workload_event("added", workload, observed_at=now))
        except InvalidPolicy as error:
            say(f"{workload.ref}: left out: {error}")
    return nodes, events


def _replays(
    args: argparse.Namespace, workloads: Sequence[WorkloadChanged]
) -> dict[WorkloadRef, Replay]:
    """Each serving workload's demand history as a trace under OUT/traces/."""
    traces = args.out / "traces"
    traces.mkdir(parents=True, exist_ok=True)
    names = unique_names([w.workload for w in workloads])
    replays = {}
    for workload in workloads:
        if workload.role != "serving" or workload.serving is None:
            continue
        ref = workload.workload
        template = workload.serving.demand_query or args.query_template
        query = string.Template(template).safe_substitute(name=ref.name, namespace=ref.namespace)
        say(f"{ref}: fetching {query}")
        try:
            history = _history(
                args.prometheus, query, since_s=args.since + args.history, step_s=args.step
            )
        except ExportError as error:
            say(f"{ref}: left out: {error}")
            continue
        _report_gaps(history, str(ref))
        path = traces / f"{names[ref]}.csv"
        write_trace(history, path)
        # The window replayed is the last --since; what comes before is history.
        start_s = max(history.rates.size * args.step - args.since, 0.0)
        replays[ref] = Replay(f"traces/{path.name}", start_s)
    return replays


def _scenario(args: argparse.Namespace) -> Scenario:
    nodes, workloads = asyncio.run(_read_cluster(args))
    say(f"cluster: {len(nodes)} nodes, {len(workloads)} labelled workloads")
    if not any(node.schedulable for node in nodes):
        raise Failure("the cluster has no schedulable node; check --kubeconfig and --context")
    replays = _replays(args, workloads)
    if not replays:
        raise Failure(
            "no serving workload with demand history: label one tideshift.io/role=serving with "
            "tideshift.io/capacity-rps, and check its tideshift.io/demand-query in Prometheus"
        )
    try:
        scenario = build_scenario(
            name="whatif",
            nodes=nodes,
            workloads=workloads,
            replays=replays,
            duration_s=args.since,
            step_s=args.step,
            history_s=args.history,
            model=args.model,
        )
    except ValidationError as error:
        first = error.errors()[0]
        where = ".".join(str(part) for part in first["loc"])
        raise Failure(f"the cluster makes an invalid scenario at {where}: {first['msg']}") from None
    path = args.out / "scenario.yaml"
    path.write_text(yaml.safe_dump(scenario.model_dump(mode="json"), sort_keys=False))
    say(f"scenario: {path} (rerun with `tideshift simulate --scenario {path}`)")
    return scenario


def headline(results: Sequence[PolicyResult], since: str) -> str:
    """ "On your last 14d, Tideshift would have ...": its figures beside each baseline's."""
    ours = next((r for r in results if r.name == "tideshift"), None)
    others = [r for r in results if r.name != "tideshift"]
    if ours is None or not others:
        return ""

    def beside(figure: Callable[[PolicyResult], Any], form: str) -> str:
        return ", ".join(f"{r.name} {format(figure(r), form)}" for r in others)

    return (
        f"On your last {since}, Tideshift would have used {ours.cpu_used:.1%} of the cluster's "
        f"cpu ({beside(lambda r: r.cpu_used, '.1%')}), left serving short for "
        f"{ours.shortfall_minutes} min ({beside(lambda r: r.shortfall_minutes, 'd')}) and done "
        f"{ours.training_work:.0f} units of training work "
        f"({beside(lambda r: r.training_work, '.0f')})."
    )


def _plot(result: PolicyResult, scenario: Scenario, out: Path) -> str:
    try:
        return f"plot {plot(result, scenario, out)}"
    except ImportError:  # the container image leaves matplotlib out
        return "no plot: matplotlib is not installed (pip install 'tideshift[report]')"


def whatif_main(argv: Sequence[str]) -> int:
    parser = _whatif_parser()
    args = parser.parse_args(list(argv))
    since_text = args.since
    for flag in ("since", "history", "step"):
        try:
            setattr(args, flag, parse_duration(getattr(args, flag)))
        except ValueError as error:
            parser.error(f"--{flag}: {error}")
    try:
        args.out.mkdir(parents=True, exist_ok=True)
        scenario = _scenario(args)
        base = args.out.resolve()
        profiles = [spec.traffic.profile(base, None) for spec in scenario.serving]
    except (Failure, ScenarioError) as error:
        print(f"tideshift whatif: {error}", file=sys.stderr)
        return 2
    results = []
    for name in args.policies or list(POLICIES):
        say(f"simulating {name} ...")
        result = run_policy(scenario, profiles, name, progress=say)
        say(f"{name}: done in {result.wall_s:.1f} s; {_plot(result, scenario, args.out)}")
        results.append(result)
    print(headline(results, since_text))
    print(format_table(results))
    return 0
