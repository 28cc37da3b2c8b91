"""Backtest benchmark: every model on both shared traces at 15-min and 1-h horizons.

Run: .venv/bin/python tests/benchmarks/bench_backtest.py [--traces DIR] [--models a,b]
(or through pytest: .venv/bin/pytest -s tests/benchmarks/bench_backtest.py). Prints one table
per (trace, horizon) and the goal check: the default model's pinball loss at q0.95 at least
15 % below holt_winters and fft, its under-provisioning rate within 3-7 %, and the full
backtest of the 1-min trace (all models, one horizon) within 2 minutes of wall time.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from tideshift.services.predictor.backtest import format_table
from tideshift.services.predictor.core.evaluation import (
    Score,
    parse_trace,
    plan_backtest,
    run_backtest,
)
from tideshift.services.predictor.core.models import DEFAULT_MODEL, build_model, model_names

TRACES = ("nasa_http_jul95_1min.csv", "wikipedia_pagecounts_1h.csv")
HORIZONS_S = (900.0, 3600.0)
RIVALS = ("holt_winters", "fft")
DEFAULT_TRACES_DIR = Path(__file__).resolve().parents[3] / "shared" / "traces"


def run(traces_dir: Path, models: list[str], files: list[str]) -> list[str]:
    verdicts: list[str] = []
    for file_name in files:
        path = traces_dir / file_name
        with path.open(encoding="utf-8") as handle:
            trace = parse_trace(handle, source=file_name)
        for horizon_s in HORIZONS_S:
            plan = plan_backtest(
                trace, horizon_s=horizon_s, step_s=300.0, refit_s=86400.0, warmup_s=None
            )
            scores: dict[str, Score] = {}
            started = time.perf_counter()
            cpu_started = time.process_time()
            for name in models:
                scores[name] = run_backtest(trace, build_model(name), plan, clock=time.perf_counter)
            wall = time.perf_counter() - started
            cpu = time.process_time() - cpu_started
            print(format_table(trace, plan, scores, horizon_s=horizon_s))
            print(f"all models: {wall:.1f} s wall, {cpu:.1f} s CPU\n", flush=True)
            verdicts += _verdicts(file_name, horizon_s, scores, wall)
    return verdicts


def _verdicts(trace: str, horizon_s: float, scores: dict[str, Score], wall: float) -> list[str]:
    label = f"{trace} @ {horizon_s / 60:g} min"
    lines: list[str] = []
    best = scores.get(DEFAULT_MODEL)
    if best is None:
        return lines
    for rival in RIVALS:
        if rival in scores:
            gain = 1.0 - best.pinball_q95 / scores[rival].pinball_q95
            verdict = "ok" if gain >= 0.15 else "SHORT"
            lines.append(f"{label}: pinball q95 {100 * gain:+.1f} % vs {rival} [{verdict}]")
    rate = best.under_rate_q95
    lines.append(
        f"{label}: under-rate {100 * rate:.2f} % [{'ok' if 0.03 <= rate <= 0.07 else 'SHORT'}]"
    )
    if "1min" in trace:
        lines.append(f"{label}: full backtest {wall:.1f} s [{'ok' if wall <= 120 else 'SHORT'}]")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--traces", type=Path, default=DEFAULT_TRACES_DIR)
    parser.add_argument("--models", default=",".join(model_names()))
    parser.add_argument("--files", default=",".join(TRACES), help="trace files in --traces")
    args = parser.parse_args(argv)
    models = [name for name in args.models.split(",") if name]
    verdicts = run(args.traces, models, [name for name in args.files.split(",") if name])
    print("goal check (default model: " + DEFAULT_MODEL + ")")
    print("\n".join(verdicts))
    return 0


if __name__ == "__main__":
    sys.exit(main())
