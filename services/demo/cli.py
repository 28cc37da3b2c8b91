"""`tideshift demo`: a whole day and night in a few minutes, in one command.

    tideshift demo --out demo-out                      # embedded NATS + sim cluster (default)
    tideshift demo --out demo-out --trace nasa.csv     # replay a request trace instead
    tideshift demo --cluster kubeconfig --out demo-out # a real API server, real HTTP, Prometheus

Writes to --out: `demo.png` (demand vs serving capacity, trainers per job, utilisation),
`summary.txt` and `summary.json` (the figures `tideshift simulate` reports, plus the real
training progress), `events.jsonl` (every event on the bus) and `logs/` (trainer processes).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from tideshift.loadgen.core.profiles import (
    DiurnalProfile,
    RateProfile,
    TraceProfile,
    amplitude_for_peak,
)
from tideshift.loadgen.traces import TraceError, read_trace
from tideshift.services.common.embedded_nats import NatsServerError
from tideshift.services.common.ports import port_in_use
from tideshift.services.demo.errors import DemoError

SIM_PEAK_RPS, SIM_TROUGH_RPS = 6800.0, 1200.0
# Real HTTP from this machine to the sample app (see services/demo/kubedemo.py).
KUBE_PEAK_RPS, KUBE_TROUGH_RPS = 200.0, 40.0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="tideshift demo",
        description="A day and a night of serving traffic in minutes: forecasts, scaling ahead "
        "of demand, and elastic training filling the rest of the cluster.",
    )
    parser.add_argument(
        "--out", type=Path, default=Path("demo-out"), help="output directory (default demo-out)"
    )
    parser.add_argument(
        "--cluster",
        default="sim",
        metavar="sim|kubeconfig|PATH",
        help="sim (default: in-process simulated cluster), kubeconfig ($KUBECONFIG or the "
        "local control plane of `tideshift dev cluster up`), or a kubeconfig file path",
    )
    parser.add_argument("--hours", type=float, default=24.0, help="simulated hours (default 24)")
    parser.add_argument(
        "--speed",
        type=float,
        default=None,
        help="simulated seconds per wall second (default 288 in sim: a day in 5 minutes; "
        "144 against a cluster: a day in 10 minutes of real traffic)",
    )
    parser.add_argument("--trace", type=Path, help="replay a timestamp_s,requests CSV")
    parser.add_argument(
        "--trace-start-hour", type=float, default=0.0, help="offset into the trace (hours)"
    )
    parser.add_argument(
        "--peak-rps",
        type=float,
        default=None,
        help="busiest demand, req/s (default 6800 in sim, 200 of real HTTP against a cluster)",
    )
    parser.add_argument(
        "--trough-rps",
        type=float,
        default=None,
        help="quietest demand (default 1200 in sim, 40 against a cluster)",
    )
    parser.add_argument("--noise", type=float, default=0.04, help="relative jitter (default 0.04)")
    parser.add_argument("--seed", type=int, default=1, help="seed of the noise (default 1)")
    parser.add_argument(
        "--no-trainers",
        action="store_true",
        help="do not start real trainer processes (sim trainers only)",
    )
    parser.add_argument(
        "--lend",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="a fourth, batch job whose 1-core trainers borrow serving's idle reservation "
        "(sim cluster; default on: --no-lend runs the three jobs on requests alone)",
    )
    parser.add_argument("--nats-port", type=int, default=0, help="NATS port (default: any free)")
    parser.add_argument("--quiet", action="store_true", help="no progress line")
    parser.add_argument("--verbose", action="store_true", help="service logs on stderr")
    return parser


def build_profile(args: argparse.Namespace) -> tuple[RateProfile, str]:
    if args.trace is not None:
        try:
            trace = read_trace(args.trace)
        except TraceError as error:
            raise DemoError(f"--trace: {error}") from None
        # Scale the replayed window (not the whole trace) to the peak: a quiet day of a trace
        # with one launch-day surge should still fill the cluster by day.
        window_start = trace.timestamps[0] + args.trace_start_hour * 3600
        window = tuple(
            count
            for timestamp, count in zip(trace.timestamps, trace.counts, strict=True)
            if window_start <= timestamp < window_start + args.hours * 3600
        )
        try:
            amplitude = amplitude_for_peak(window or trace.counts, trace.interval_s, args.peak_rps)
        except ValueError as error:
            raise DemoError(f"--trace {args.trace}: {error}") from None
        replay: RateProfile = TraceProfile(
            trace.timestamps,
            trace.counts,
            trace.interval_s,
            start_s=trace.timestamps[0] + args.trace_start_hour * 3600,
            amplitude=amplitude,
        )
        return replay, (
            f"trace {args.trace.name} from hour {args.trace_start_hour:g}, "
            f"scaled to a {args.peak_rps:g} req/s peak"
        )
    try:
        profile = DiurnalProfile(
            peak_rps=args.peak_rps,
            trough_rps=args.trough_rps,
            noise=args.noise,
            seed=args.seed,
        )
    except ValueError as error:
        raise DemoError(f"invalid profile: {error}") from None
    return profile, f"synthetic day {args.trough_rps:g}-{args.peak_rps:g} req/s"


def check_out_dir(out: Path) -> None:
    """Fail early, before anything starts, when --out cannot be written."""
    try:
        out.mkdir(parents=True, exist_ok=True)
        probe = out / ".tideshift-write-test"
        probe.write_text("ok")
        probe.unlink()
    except OSError as error:
        raise DemoError(
            f"cannot write to --out {out} ({error.strerror}); choose a directory you can "
            "write, e.g. --out ./demo-out"
        ) from None
    for stale in ("events.jsonl",):
        (out / stale).unlink(missing_ok=True)


def _validate(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    if not args.hours > 0:
        parser.error("--hours: expected > 0")
    if args.speed is not None and not args.speed > 0:
        parser.error("--speed: expected > 0")
    if not 0 <= args.nats_port <= 65535:
        parser.error("--nats-port: expected 0..65535")
    if not 0 <= args.noise <= 1:
        parser.error("--noise: expected 0..1")
    sim = args.cluster == "sim"
    if args.peak_rps is None:
        args.peak_rps = SIM_PEAK_RPS if sim else KUBE_PEAK_RPS
    if args.trough_rps is None:
        args.trough_rps = min(args.peak_rps, SIM_TROUGH_RPS if sim else KUBE_TROUGH_RPS)
    if not args.peak_rps > 0:
        parser.error("--peak-rps: expected > 0")
    if not 0 <= args.trough_rps <= args.peak_rps:
        parser.error("--trough-rps: expected between 0 and --peak-rps")


def _progress_printer(quiet: bool) -> tuple[Callable[[str], None], Callable[[], None]]:
    tty = sys.stderr.isatty()
    last = [0.0]

    def show(line: str) -> None:
        if quiet:
            return
        if tty:
            sys.stderr.write("\r" + line + "\x1b[K")
        else:
            now = time.monotonic()
            if now - last[0] < 5.0:
                return
            last[0] = now
            sys.stderr.write(line + "\n")
        sys.stderr.flush()

    def done() -> None:
        if tty and not quiet:
            sys.stderr.write("\n")

    return show, done


def main(argv: Sequence[str]) -> int:
    parser = build_parser()
    args = parser.parse_args(list(argv))
    _validate(parser, args)
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.ERROR,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    try:
        check_out_dir(args.out)
        profile, profile_name = build_profile(args)
        if args.nats_port and port_in_use(args.nats_port):
            raise DemoError(
                f"--nats-port {args.nats_port} is already in use; choose another port or leave "
                "it out to use any free one"
            )
        if args.cluster == "sim":
            return _run_sim(args, profile, profile_name)
        return _run_kube(args, profile, profile_name)
    except DemoError as error:
        print(f"tideshift demo: {error}", file=sys.stderr)
        return 1
    except NatsServerError as error:
        print(f"tideshift demo: {error}", file=sys.stderr)
        return 1


def _run_sim(args: argparse.Namespace, profile: RateProfile, profile_name: str) -> int:
    from tideshift.services.demo.report import format_table, plot, write_json
    from tideshift.services.demo.simdemo import SimDemoConfig, run_sim_demo
    from tideshift.services.demo.world import demo_world

    speed = args.speed or 288.0
    config = SimDemoConfig(
        out=args.out,
        profile=profile,
        profile_name=profile_name,
        hours=args.hours,
        speed=speed,
        nats_port=args.nats_port,
        real_trainers=not args.no_trainers,
        world=demo_world(lend=args.lend),
    )
    show, done = _progress_printer(args.quiet)
    wall = args.hours * 3600 / speed
    print(
        f"tideshift demo: {args.hours:g} simulated hours of {profile_name} at {speed:g}x "
        f"(~{wall / 60:.1f} min); sim cluster of {config.world.nodes} nodes, "
        f"{len(config.world.jobs)} elastic jobs; output in {args.out}/",
        file=sys.stderr,
    )
    summary, meter, _ = asyncio.run(run_sim_demo(config, progress=show))
    done()
    table = format_table(summary)
    png = plot(
        meter,
        args.out / "demo.png",
        title=f"tideshift demo: {profile_name}",
        training=summary.training_series,
    )
    (args.out / "summary.txt").write_text(table + "\n")
    write_json(summary, args.out / "summary.json")
    print(table)
    print(
        f"\nwrote {png}, {args.out / 'summary.txt'}, {args.out / 'summary.json'}, "
        f"{args.out / 'events.jsonl'}"
    )
    return 0


def _run_kube(args: argparse.Namespace, profile: RateProfile, profile_name: str) -> int:
    kubeconfig = None if args.cluster == "kubeconfig" else args.cluster
    if kubeconfig is not None and not os.path.exists(kubeconfig):
        raise DemoError(
            f"--cluster {kubeconfig}: no such kubeconfig file; pass `sim`, `kubeconfig` or a path"
        )
    from tideshift.services.demo.kubedemo import run_kube_demo

    show, done = _progress_printer(args.quiet)
    try:
        code: int = run_kube_demo(args, profile, profile_name, kubeconfig=kubeconfig, progress=show)
    finally:
        done()
    return code
