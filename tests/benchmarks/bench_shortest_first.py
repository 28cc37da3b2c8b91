"""plan() speed when training jobs are finite: bench_planner_speed's cluster (5,000 nodes,
150,000 pods, 100 serving workloads, 200 jobs in three tiers) planned as it is (every job of
unknown length: fair shares only) and with every job's remaining work known (the tiers then
redo the finite jobs' counts shortest-remaining-first, policy/tiers.py). Prints p50/p99 cpu
time of plan() for both and their ratio, measured in the same run.

Run: .venv/bin/python tests/benchmarks/bench_shortest_first.py. Asserts nothing."""

from __future__ import annotations

import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_planner_speed import build_inputs

from tideshift.services.planner.core import PlanInputs, PlanState, plan

ROUNDS = 30


def cpu_times(inputs: PlanInputs) -> list[float]:
    """plan()'s cpu time per round, 15 s apart (its state carried, as the service does)."""
    state, timings = PlanState(), []
    for round_index in range(ROUNDS):
        started = time.process_time()
        _, state = plan(inputs, state, 15.0 * round_index)
        timings.append(time.process_time() - started)
    return sorted(timings)


def main() -> int:
    inputs, _ = build_inputs()
    finite = replace(
        inputs,
        jobs=tuple(
            replace(job, remaining_work=3600.0 * (1 + index % 17))
            for index, job in enumerate(inputs.jobs)
        ),
    )
    results = {}
    for label, planned in (("fair shares only", inputs), ("every job finite", finite)):
        timings = cpu_times(planned)
        p50 = statistics.median(timings) * 1000
        p99 = timings[min(len(timings) - 1, int(0.99 * len(timings)))] * 1000
        results[label] = p50
        print(f"{label}: plan() cpu p50 {p50:.1f} ms, p99 {p99:.1f} ms over {ROUNDS} runs")
    ratio = results["every job finite"] / results["fair shares only"]
    print(f"finite / fair p50: {ratio:.2f}x (goal of bench_planner_speed: p99 < 100 ms)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
