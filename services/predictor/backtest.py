"""`tideshift backtest`: rolling-origin comparison of forecasters on a request trace."""

from __future__ import annotations

import argparse
import itertools
import json
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TextIO

from tideshift.loadgen.core import families
from tideshift.loadgen.traces import TraceError
from tideshift.services.predictor.core.evaluation import (
    BacktestPlan,
    Score,
    Trace,
    parse_duration,
    parse_trace,
    plan_backtest,
    run_backtest,
)
from tideshift.services.predictor.core.models import DEFAULT_MODEL, MODELS, build_model
from tideshift.services.predictor.core.models.portfolio import Portfolio

EXIT_USAGE = 2
# A generated family stays in memory: at most ten years, at most five million points.
MAX_FAMILY_DAYS = 3660.0
MAX_FAMILY_POINTS = 5_000_000
# A trace line is two numbers; anything much longer is not a trace (and is never read whole).
MAX_LINE_CHARS = 4096


def _duration(text: str) -> float:
    try:
        return parse_duration(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def _model_list(text: str) -> list[str]:
    names = [name.strip() for name in text.split(",") if name.strip()]
    unknown = [name for name in names if name not in MODELS]
    if unknown or not names:
        raise argparse.ArgumentTypeError(
            f"unknown model(s) {', '.join(unknown) or '(none)'}; expected a comma-separated "
            f"subset of {', '.join(MODELS)}"
        )
    return names


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="tideshift backtest",
        description=(
            "Rolling-origin backtest: at each origin every model sees only the past (refitted "
            "at the refit cadence, updated with new observations in between) and forecasts the "
            "horizon. Prints MAPE, sMAPE, pinball loss at q0.95, the share of intervals whose "
            "demand exceeded the q0.95 forecast (under-provisioning rate) and fit+predict time. "
            "In --json output rates are fractions (0.05 = 5 %%)."
        ),
    )
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--trace", type=Path, help="CSV with header timestamp_s,requests")
    source.add_argument(
        "--family",
        choices=families.family_names(),
        help="a synthetic traffic family instead of a trace (see --seed, --family-days)",
    )
    parser.add_argument("--seed", type=int, default=0, help="the family member (default 0)")
    parser.add_argument(
        "--family-days", type=float, default=21.0, help="days of the family to generate (21)"
    )
    parser.add_argument(
        "--family-interval", type=_duration, default=60.0, help="the family's grid (1m)"
    )
    parser.add_argument("--horizon", type=_duration, default=900.0, help="forecast horizon (15m)")
    parser.add_argument("--step", type=_duration, default=300.0, help="origin spacing (5m)")
    parser.add_argument("--refit", type=_duration, default=86400.0, help="refit cadence (1d)")
    parser.add_argument(
        "--warmup",
        type=_duration,
        default=None,
        help="history before the first origin (default: 7d, or a quarter of a shorter trace)",
    )
    parser.add_argument(
        "--duration", type=_duration, default=None, help="use only the trace's first DURATION"
    )
    parser.add_argument(
        "--models",
        type=_model_list,
        default=list(MODELS),
        help=f"comma-separated models (default: all of {', '.join(MODELS)})",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON document")
    parser.add_argument("--quiet", action="store_true", help="no progress on stderr")
    return parser


def main(argv: Sequence[str]) -> int:
    parser = build_parser()
    args = parser.parse_args(list(argv))
    trace = _load_trace(parser, args)
    if trace is None:
        return EXIT_USAGE
    if args.duration is not None:
        trace = trace.head(args.duration)
    try:
        plan = plan_backtest(
            trace,
            horizon_s=args.horizon,
            step_s=args.step,
            refit_s=args.refit,
            warmup_s=args.warmup,
        )
    except ValueError as error:
        print(f"tideshift backtest: --warmup/--horizon: {error}", file=sys.stderr)
        return EXIT_USAGE
    scores, choices = _score(trace, plan, args.models, quiet=args.quiet)
    if args.json:
        print(json.dumps(_document(trace, scores, choices, horizon_s=args.horizon), indent=2))
    else:
        print(format_table(trace, plan, scores, horizon_s=args.horizon))
    return 0


def _load_trace(parser: argparse.ArgumentParser, args: argparse.Namespace) -> Trace | None:
    """The family member or trace file asked for; None (reported) when it cannot be read."""
    if args.family is not None:
        if not 0 < args.family_days <= MAX_FAMILY_DAYS:
            parser.error(f"--family-days: expected a number of days > 0 and <= {MAX_FAMILY_DAYS:g}")
        if args.family_days * 86400.0 / args.family_interval > MAX_FAMILY_POINTS:
            parser.error(
                f"--family-interval: expected at most {MAX_FAMILY_POINTS:,} points over "
                "--family-days; raise the interval or generate fewer days"
            )
        series = families.generate(
            args.family,
            seed=args.seed,
            duration_s=args.family_days * 86400.0,
            interval_s=args.family_interval,
        )
        return parse_trace(
            families.to_csv(series).splitlines(), source=f"{args.family}#{args.seed}"
        )
    try:
        if args.trace.exists() and not args.trace.is_file():
            # A device such as /dev/zero never ends; a directory has no lines.
            raise TraceError(f"{args.trace}: expected a regular CSV file")
        with args.trace.open(encoding="utf-8") as handle:
            return parse_trace(_bounded_lines(handle, str(args.trace)), source=str(args.trace))
    except OSError as error:
        print(f"tideshift backtest: --trace: cannot read {args.trace}: {error}", file=sys.stderr)
    except TraceError as error:
        print(f"tideshift backtest: --trace: {error}", file=sys.stderr)
    except UnicodeDecodeError as error:
        print(
            f"tideshift backtest: --trace: {args.trace}: expected UTF-8 text; invalid byte at "
            f"offset {error.start}",
            file=sys.stderr,
        )
    return None


def _bounded_lines(handle: TextIO, source: str) -> Iterator[str]:
    """The file's lines, refusing one longer than MAX_LINE_CHARS before reading it whole."""
    for number in itertools.count(1):
        line = handle.readline(MAX_LINE_CHARS + 1)
        if not line:
            return
        if len(line) > MAX_LINE_CHARS:
            raise TraceError(
                f"{source} line {number}: expected a line of at most {MAX_LINE_CHARS} characters",
                line=number,
            )
        yield line


def _score(
    trace: Trace, plan: BacktestPlan, models: Sequence[str], *, quiet: bool
) -> tuple[dict[str, Score], dict[str, object]]:
    """Each model's score on the plan, and what each portfolio chose."""
    scores: dict[str, Score] = {}
    choices: dict[str, object] = {}
    for name in models:
        reporter = None if quiet else _ProgressReporter(name)
        model = build_model(name)
        scores[name] = run_backtest(trace, model, plan, clock=time.perf_counter, progress=reporter)
        if isinstance(model, Portfolio):
            choices[name] = model.choices()
        if reporter is not None:
            reporter.finish(scores[name])
    return scores, choices


def _document(
    trace: Trace, scores: dict[str, Score], choices: dict[str, object], *, horizon_s: float
) -> dict[str, object]:
    return {
        "models": {
            name: {
                "mape": score.mape,
                "smape": score.smape,
                "pinball_q95": score.pinball_q95,
                "under_rate_q95": score.under_rate_q95,
                "seconds": round(score.seconds, 3),
            }
            for name, score in scores.items()
        },
        "default": DEFAULT_MODEL,
        # What each portfolio chose: member weights per step ahead at the end of the run and
        # the share of forecast steps each member led.
        "choices": choices,
        "trace": trace.source,
        "horizon_s": horizon_s,
    }


def format_table(
    trace: Trace, plan: BacktestPlan, scores: dict[str, Score], *, horizon_s: float
) -> str:
    interval = trace.interval_s
    origins = next(iter(scores.values())).origins if scores else 0
    lines = [
        f"trace {trace.source}: {trace.values.shape[0]} rows every {interval:g} s; horizon "
        f"{horizon_s:g} s ({plan.horizon_steps} steps), origin every "
        f"{plan.origin_every_steps * interval:g} s, refit every "
        f"{plan.refit_every_steps * interval:g} s, {origins} origins",
        f"{'model':<24}{'MAPE %':>9}{'sMAPE %':>9}{'pinball q95':>14}{'under q95 %':>13}"
        f"{'seconds':>9}",
    ]
    for name, score in scores.items():
        marker = " *" if name == DEFAULT_MODEL else ""
        lines.append(
            f"{name + marker:<24}{100 * score.mape:>9.2f}{100 * score.smape:>9.2f}"
            f"{score.pinball_q95:>14.4g}{100 * score.under_rate_q95:>13.2f}{score.seconds:>9.2f}"
        )
    lines.append("* default model")
    return "\n".join(lines)


class _ProgressReporter:
    """Progress on stderr, at most every few seconds, so long runs show they are alive."""

    def __init__(self, name: str, every_s: float = 5.0) -> None:
        self.name = name
        self.every_s = every_s
        self.started = time.monotonic()
        self.last = self.started

    def __call__(self, done: int, total: int) -> None:
        now = time.monotonic()
        if now - self.last >= self.every_s:
            self.last = now
            print(
                f"  {self.name}: {done}/{total} origins ({100 * done / total:.0f} %)",
                file=sys.stderr,
                flush=True,
            )

    def finish(self, score: Score) -> None:
        print(
            f"  {self.name}: done, {score.origins} origins in "
            f"{time.monotonic() - self.started:.1f} s",
            file=sys.stderr,
            flush=True,
        )
