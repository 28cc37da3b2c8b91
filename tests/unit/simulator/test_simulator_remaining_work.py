"""`simulate` gives the planner each finite job's true remaining work (what the running planner
estimates from the job's progress), so Tideshift runs the job closest to done largest."""

from __future__ import annotations

from tideshift.services.simulator.core.training import JobProgress, WorkModel
from tideshift.services.simulator.run import run_policy
from tideshift.services.simulator.scenario import parse_scenario

SCENARIO = """
name: two-finite-jobs
duration_s: 600
step_s: 5
plan_interval_s: 5
forecaster: {kind: oracle}
nodes:
  - {count: 2, cpu: 16, memory_gib: 64, name_prefix: cpu}
training:
  restart_cost_s: 10
  jobs:
    - {name_prefix: long, count: 1, trainer: {cpu: 1, memory_gib: 2}, min_trainers: 4,
       max_trainers: 28, work: 1000000}
    - {name_prefix: short, count: 1, trainer: {cpu: 1, memory_gib: 2}, min_trainers: 4,
       max_trainers: 28, work: 5000}
"""


def test_the_remaining_work_is_what_a_finite_job_has_left() -> None:
    progress = JobProgress()
    progress.advance(0.0, 100.0, ready=1, running=True, model=WorkModel(1.0, 0.0))
    assert progress.remaining(250.0) == 150.0
    assert progress.remaining(50.0) == 0.0
    assert progress.remaining(None) is None


def test_tideshift_runs_the_job_closest_to_done_largest() -> None:
    result = run_policy(parse_scenario(SCENARIO), [], "tideshift")
    trainers = result.series["trainers"]
    finished = {item.group: item.finished_at for item in result.job_outcomes}
    assert finished["long"] is None
    short_done = finished["short"]
    assert short_done is not None
    running = [i for i, t in enumerate(result.series["t"]) if 20 <= t < short_done - 5]
    assert running
    # Until the short job is done it runs at its maximum, the long one at its gang.
    assert {trainers["short-0"][i] for i in running} == {28}
    assert {trainers["long-0"][i] for i in running} == {4}
    # Then the long one takes the room.
    assert trainers["long-0"][-1] == 28
