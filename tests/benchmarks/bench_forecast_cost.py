"""Forecast cost benchmark: fit and update time per workload, and how many workloads one
core keeps fresh at a 1-minute cadence.

Run: .venv/bin/python tests/benchmarks/bench_forecast_cost.py [--models a,b] [--workloads N]

Each workload is a different synthetic family member (loadgen/core/families.py) on a 1-minute
grid with 14 days of history. Per model it measures, in CPU seconds of this process:
the first fit, one refit, and one minute of steady work (update with the new sample, then a
30-step forecast), averaged over a simulated hour. Workloads per core at a 1-minute cadence =
60 s / (update+predict per minute + first fit x refits per minute): the predictor service
builds a fresh model at each refit, hourly by default (`refit_seconds`). The baseline is
`tidal`, measured in the same run; the goal for the default model is >= 200 per core.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import numpy as np

from tideshift.loadgen.core import families
from tideshift.services.predictor.core.models import DEFAULT_MODEL, build_model

HISTORY_DAYS = 14
STEADY_MINUTES = 60
REFITS_PER_HOUR = 1.0
GOAL_WORKLOADS = 200


def measure(name: str, seeds: list[int]) -> dict[str, float]:
    fits, refits, minutes = [], [], []
    for index, seed in enumerate(seeds):
        family = families.family_names()[index % len(families.family_names())]
        series = families.generate(
            family,
            seed=seed,
            duration_s=(HISTORY_DAYS * 1440 + STEADY_MINUTES) * 60.0,
            interval_s=60.0,
        )
        split = HISTORY_DAYS * 1440
        times, values = series.timestamps, series.counts
        model = build_model(name, {"default_interval_s": 60.0})
        started = time.process_time()
        model.fit(times[:split], values[:split])
        fits.append(time.process_time() - started)
        started = time.process_time()
        for minute in range(split, split + STEADY_MINUTES):
            model.update(times[minute : minute + 1], values[minute : minute + 1])
            model.predict(30)
        minutes.append((time.process_time() - started) / STEADY_MINUTES)
        started = time.process_time()
        model.fit(times, values)
        refits.append(time.process_time() - started)
    # The predictor service builds a new model at each refit, so a refit costs a first fit.
    per_minute = statistics.median(minutes) + statistics.median(fits) * REFITS_PER_HOUR / 60
    return {
        "first_fit_s": statistics.median(fits),
        "refit_s": statistics.median(refits),
        "update_predict_s": statistics.median(minutes),
        "workloads_per_core": 60.0 / per_minute,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=f"tidal,{DEFAULT_MODEL}")
    parser.add_argument("--workloads", type=int, default=7, help="family members per model")
    args = parser.parse_args(argv)
    names = [name.strip() for name in args.models.split(",") if name.strip()]
    seeds = list(range(args.workloads))
    # Warm up imports and just-in-time compilation (statsforecast uses numba) outside the
    # measurement: a long-running predictor pays it once.
    for name in names:
        warm = build_model(name, {"default_interval_s": 60.0})
        t = np.arange(0.0, 3 * 86400.0, 60.0)
        warm.fit(t, 100 + 10 * np.sin(t / 5000.0))
        warm.update([t[-1] + 60.0], [100.0])
        warm.predict(30)
    results = {name: measure(name, seeds) for name in names}
    print(f"{len(seeds)} workloads per model, 1-min grid, {HISTORY_DAYS} d history (CPU s)")
    print(f"{'model':<14}{'first fit':>11}{'refit':>9}{'update+predict':>16}{'per core':>10}")
    for name, figures in results.items():
        print(
            f"{name:<14}{figures['first_fit_s']:>11.3f}{figures['refit_s']:>9.3f}"
            f"{figures['update_predict_s']:>16.4f}{figures['workloads_per_core']:>10.0f}"
        )
    if "tidal" in results and DEFAULT_MODEL in results and DEFAULT_MODEL != "tidal":
        ratio = (
            results[DEFAULT_MODEL]["workloads_per_core"] / results["tidal"]["workloads_per_core"]
        )
        print(f"{DEFAULT_MODEL} keeps {ratio:.2f}x as many workloads fresh per core as tidal")
    if DEFAULT_MODEL in results:
        kept = results[DEFAULT_MODEL]["workloads_per_core"]
        verdict = "met" if kept >= GOAL_WORKLOADS else "NOT met"
        print(f"goal >= {GOAL_WORKLOADS} workloads per core for {DEFAULT_MODEL}: {verdict}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
