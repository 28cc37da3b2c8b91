"""Batch capacity in `simulate`: opted-in trainers bind on what serving reserves but does not
use, and the figures say so (where they bind and when they are evicted:
test_simulator_lending.py, the world `simulate` and the demo share)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tideshift.loadgen.core.profiles import RateProfile
from tideshift.services.simulator.run import run_policy
from tideshift.services.simulator.scenario import ScenarioError, parse_scenario

# Serving requests 15 to 30 of the 32 cores and uses half of that at most; one job runs on
# requests, one on batch capacity. Each level lasts 20 minutes: batch trainers grow only into
# room that stayed (and that the forecast keeps) for `batch_grow_after_s`, 10 minutes.
SCENARIO = """
name: batch
duration_s: 3600
step_s: 5
plan_interval_s: 10
forecaster: {kind: oracle}
nodes:
  - {count: 4, cpu: 8, memory_gib: 32}
serving:
  - name: web
    replica: {cpu: 1, memory_gib: 1}
    capacity_rps: 20
    target_utilization: 0.5
    min_replicas: 1
    max_replicas: 32
    startup_delay_s: 10
    stabilization_s: 60
    traffic: {kind: points, points: [[0, 150], [1200, 300], [2400, 150]]}
training:
  jobs:
    - {name_prefix: plain, trainer: {cpu: 1, memory_gib: 1}, min_trainers: 1,
       max_trainers: 32, startup_delay_s: 5}
    - {name_prefix: lent, trainer: {cpu: 1, memory_gib: 1}, min_trainers: 1,
       max_trainers: 32, startup_delay_s: 5, batch: true}
"""


def profiles(text: str) -> list[RateProfile]:
    scenario = parse_scenario(text, "batch.yaml")
    return [spec.traffic.profile(Path("."), None) for spec in scenario.serving]


def test_batch_job_raises_cpu_in_use_without_starving_serving() -> None:
    scenario = parse_scenario(SCENARIO, "batch.yaml")
    without = parse_scenario(SCENARIO.replace("batch: true", "batch: false"), "batch.yaml")
    lent = run_policy(scenario, profiles(SCENARIO), "tideshift")
    plain = run_policy(without, profiles(SCENARIO), "tideshift")
    assert lent.cpu_batch > 0.05
    assert lent.cpu_used > plain.cpu_used + 0.05
    assert lent.serving_starved_minutes == 0
    assert lent.shortfall_minutes == plain.shortfall_minutes
    # Batch trainers request nothing: requested cpu does not count them.
    assert lent.utilization["cpu"] <= plain.utilization["cpu"] + 0.01
    # The baselines run the same job on requests.
    assert run_policy(scenario, profiles(SCENARIO), "hpa").cpu_batch == 0


def test_batch_job_with_parameter_servers_is_refused_by_field() -> None:
    text = SCENARIO.replace("startup_delay_s: 5, batch: true", "pservers: 1, batch: true")
    with pytest.raises(ScenarioError, match="pservers: 0"):
        parse_scenario(text, "batch.yaml")
