"""`tideshift loadgen`: open-loop HTTP load following a diurnal profile or a replayed trace.

    tideshift loadgen --target http://127.0.0.1:8080/ --duration 600 --speed 144 \\
        --peak-rps 200 --trough-rps 40
    tideshift loadgen --target http://127.0.0.1:8080/ --duration 600 \\
        --trace nasa_http_jul95_1min.csv --speed 144 --peak-rps 300

A progress line goes to stderr; the final report (JSON) to stdout or --report FILE.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from tideshift.loadgen.core.profiles import (
    DiurnalProfile,
    RateProfile,
    Surge,
    TraceProfile,
    amplitude_for_peak,
)
from tideshift.loadgen.driver import (
    DriverConfig,
    LoadStats,
    TargetRefused,
    check_target,
    drive,
    in_cluster_names,
)
from tideshift.loadgen.traces import TraceError, read_trace


def _surge(text: str) -> Surge:
    """`START_H:DURATION_H:MULTIPLIER` in profile hours, e.g. `12:2:1.8`."""
    try:
        start, duration, multiplier = (float(part) for part in text.split(":"))
        return Surge(start * 3600, duration * 3600, multiplier, ramp_s=min(900, duration * 900))
    except ValueError as error:
        raise argparse.ArgumentTypeError(
            f"expected START_H:DURATION_H:MULTIPLIER (e.g. 12:2:1.8), got {text!r} ({error})"
        ) from None


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="tideshift loadgen",
        description="Open-loop HTTP load (Poisson arrivals at rate(t)); loopback targets only "
        "unless allowed.",
    )
    target = parser.add_argument_group("target")
    target.add_argument("--target", required=True, help="URL to load, e.g. http://127.0.0.1:8080/")
    target.add_argument(
        "--allow-target",
        action="append",
        default=[],
        metavar="HOST",
        help="also allow this non-loopback host (repeatable)",
    )
    target.add_argument(
        "--in-cluster-service",
        action="append",
        default=[],
        metavar="NAME.NAMESPACE",
        help="allow a Kubernetes Service's in-cluster DNS names (repeatable)",
    )
    run = parser.add_argument_group("run")
    run.add_argument("--duration", type=float, required=True, help="wall seconds to run")
    run.add_argument(
        "--speed",
        type=float,
        default=1.0,
        help="profile seconds per wall second (144 = a day in 10 minutes; default 1)",
    )
    run.add_argument(
        "--start-hour", type=float, default=0.0, help="profile time at start, in hours (default 0)"
    )
    run.add_argument("--max-in-flight", type=int, default=256, help="default 256")
    run.add_argument("--timeout", type=float, default=5.0, help="per request, seconds (default 5)")
    run.add_argument("--seed", type=int, default=0, help="seed of arrivals and noise (default 0)")
    run.add_argument("--report", type=Path, help="write the final JSON report here")
    run.add_argument("--quiet", action="store_true", help="no progress line")
    shape = parser.add_argument_group("profile (diurnal unless --trace)")
    shape.add_argument("--peak-rps", type=float, default=100.0, help="default 100")
    shape.add_argument("--trough-rps", type=float, default=25.0, help="diurnal only; default 25")
    shape.add_argument("--peak-hour", type=float, default=14.0, help="diurnal only; default 14")
    shape.add_argument(
        "--weekend-factor", type=float, default=1.0, help="Sat/Sun multiplier (default 1)"
    )
    shape.add_argument("--noise", type=float, default=0.0, help="relative jitter 0..1")
    shape.add_argument(
        "--surge",
        type=_surge,
        action="append",
        default=[],
        metavar="START_H:DURATION_H:MULT",
        help="a temporary multiplier (repeatable)",
    )
    shape.add_argument("--trace", type=Path, help="replay a timestamp_s,requests CSV instead")
    shape.add_argument(
        "--trace-start-hour", type=float, default=0.0, help="offset into the trace, hours"
    )
    return parser


def build_profile(args: argparse.Namespace) -> RateProfile:
    """Raises ValueError (or TraceError) naming the flag or the trace line."""
    if args.trace is not None:
        trace = read_trace(args.trace)
        return TraceProfile(
            trace.timestamps,
            trace.counts,
            trace.interval_s,
            start_s=trace.timestamps[0] + args.trace_start_hour * 3600,
            amplitude=amplitude_for_peak(trace.counts, trace.interval_s, args.peak_rps),
        )
    return DiurnalProfile(
        peak_rps=args.peak_rps,
        trough_rps=args.trough_rps,
        peak_hour=args.peak_hour,
        weekend_factor=args.weekend_factor,
        noise=args.noise,
        seed=args.seed,
        surges=tuple(args.surge),
    )


def progress_line(stats: LoadStats, profile_time_s: float) -> str:
    day, rest = divmod(profile_time_s, 86_400)
    hours, rest = divmod(rest, 3600)
    minutes = rest // 60
    elapsed = max(stats.elapsed_s, 1e-9)
    p90 = stats.percentile(0.9)
    return (
        f"[day {int(day)} {int(hours):02d}:{int(minutes):02d}] "
        f"{stats.offered / elapsed:7.1f} req/s offered (target {stats.expected / elapsed:7.1f}) "
        f"ok {stats.succeeded} failed {stats.failed} dropped {stats.dropped} "
        f"in flight {stats.in_flight} p90 {'-' if p90 is None else f'{p90 * 1000:.0f} ms'}"
    )


def main(argv: Sequence[str]) -> int:
    parser = build_parser()
    args = parser.parse_args(list(argv))
    _check_arguments(parser, args)
    try:
        profile = build_profile(args)
    except TraceError as error:
        print(f"tideshift loadgen: --trace: {error}", file=sys.stderr)
        return 2
    except ValueError as error:
        parser.error(str(error))
    tty = sys.stderr.isatty()
    show = _ProgressLine(tty=tty, quiet=args.quiet)
    stats = asyncio.run(
        _drive_until_signalled(
            profile, driver_config(args), show=show, progress_every_s=1.0 if tty else 5.0
        )
    )
    show.finish()
    return _emit_report(stats, args.report)


def _check_arguments(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Exit through `parser.error` on an out-of-range flag or a refused target."""
    checks = [
        (args.duration > 0, "--duration: expected seconds > 0"),
        (args.speed > 0, "--speed: expected > 0"),
        (args.max_in_flight > 0, "--max-in-flight: expected > 0"),
        (args.timeout > 0, "--timeout: expected seconds > 0"),
        (args.peak_rps >= 0, "--peak-rps: expected >= 0"),
    ]
    for ok, message in checks:
        if not ok:
            parser.error(message)
    allowed = set(args.allow_target)
    for service in args.in_cluster_service:
        allowed |= in_cluster_names(service)
    try:
        check_target(args.target, allowed_hosts=allowed)
    except TargetRefused as error:
        parser.error(str(error))


def driver_config(args: argparse.Namespace) -> DriverConfig:
    return DriverConfig(
        target=args.target,
        duration_s=args.duration,
        max_in_flight=args.max_in_flight,
        timeout_s=args.timeout,
        speed=args.speed,
        profile_start_s=args.start_hour * 3600,
        seed=args.seed,
    )


class _ProgressLine:
    """The progress line on stderr: redrawn in place on a terminal, one line per tick if not."""

    def __init__(self, *, tty: bool, quiet: bool) -> None:
        self._tty = tty
        self._quiet = quiet

    def __call__(self, stats: LoadStats, profile_time_s: float) -> None:
        if self._quiet:
            return
        line = progress_line(stats, profile_time_s)
        if self._tty:
            print("\r" + line + "\x1b[K", end="", file=sys.stderr)
        else:
            print(line, file=sys.stderr)
        sys.stderr.flush()

    def finish(self) -> None:
        """End the redrawn line so what follows starts on its own line."""
        if self._tty and not self._quiet:
            print(file=sys.stderr)


async def _drive_until_signalled(
    profile: RateProfile,
    config: DriverConfig,
    *,
    show: Callable[[LoadStats, float], None],
    progress_every_s: float,
) -> LoadStats:
    """Drive the load; SIGTERM or SIGINT ends it early with the report still written."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    return await drive(
        profile, config, on_progress=show, progress_every_s=progress_every_s, stop=stop
    )


def _emit_report(stats: LoadStats, path: Path | None) -> int:
    """The JSON report to `path`, or stdout (also when `path` cannot be written: exit 1)."""
    report = json.dumps(stats.summary(), indent=2)
    if path is None:
        print(report)
        return 0
    try:
        path.write_text(report + "\n")
    except OSError as error:
        print(f"tideshift loadgen: cannot write --report: {error.strerror}", file=sys.stderr)
        print(report)
        return 1
    return 0
