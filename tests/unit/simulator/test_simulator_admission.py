"""In `simulate`, a finite job that would cost the jobs ahead far more than it brings waits
with its parameter servers unbound, and starts when a finished job's room frees
(planner/core/training/admission.py; edl-training-only in small)."""

from __future__ import annotations

from tideshift.services.simulator.run import run_policy
from tideshift.services.simulator.scenario import parse_scenario

# 64 cores; three jobs of 4-50 trainers and 4 one-core parameter servers, 10 s apart, each
# about 200 s of work at 50 trainers (4,600 / 50 ** 0.8).
SCENARIO = """
name: finite-jobs-queue
duration_s: 900
step_s: 5
plan_interval_s: 5
forecaster: {kind: oracle}
nodes:
  - {count: 2, cpu: 32, memory_gib: 128, name_prefix: cpu}
training:
  restart_cost_s: 10
  speedup_exponent: 0.8
  jobs:
    - {name_prefix: job, count: 3, interval_s: 10, trainer: {cpu: 1, memory_gib: 2},
       min_trainers: 4, max_trainers: 50, pservers: 4, pserver: {cpu: 1, memory_gib: 2},
       work: 4600}
"""


def test_the_third_job_waits_for_the_first_ones_room_and_its_servers_hold_none() -> None:
    result = run_policy(parse_scenario(SCENARIO), [], "tideshift")
    outcomes = result.job_outcomes
    assert [item.finished_at is not None for item in outcomes] == [True, True, True]
    first_done = outcomes[0].finished_at
    assert first_done is not None
    # The first job ran at its maximum from start to end: 10 s start-up + 201 s of work.
    assert first_done <= 225.0
    # The third waited for it (admitted at once it would have taken the first's trainers).
    assert outcomes[2].started_at is not None and outcomes[2].started_at >= first_done
    times = result.series["t"]
    # Each job's series starts at its arrival; all end with the run.
    ready = {
        name: dict(zip(times[len(times) - len(counts) :], counts, strict=True))
        for name, counts in result.series["trainers"].items()
    }
    waiting = [t for t in times if 30.0 <= t < first_done]
    assert waiting
    assert {ready["job-2"][t] for t in waiting} == {0}
    # Its parameter servers are not bound meanwhile: the first two hold every other core.
    assert {ready["job-0"][t] + ready["job-1"][t] for t in waiting} == {64 - 2 * 4}
