"""`tideshift simulate` gives the same JSON for the same input in separate processes.

Each run gets its own PYTHONHASHSEED, so anything that iterates a hash-ordered set of strings
(or reads an unseeded random source or the clock) shows up as a difference.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

# Several job groups of different shapes arrive at once next to two serving workloads, so
# the simulator reconciles many workloads in the same step: the order it does so decides
# which pods get which nodes.
SCENARIO = """
name: reproducible
duration_s: 900
step_s: 5
plan_interval_s: 10
forecaster: {kind: oracle, interval_s: 60, horizon_s: 600}
nodes:
  - {count: 6, cpu: 16, memory_gib: 64}
  - {count: 2, cpu: 32, memory_gib: 128, gpu: 4, name_prefix: gpu}
serving:
  - name: web
    replica: {cpu: 1, memory_gib: 2}
    capacity_rps: 20
    min_replicas: 2
    max_replicas: 80
    startup_delay_s: 20
    stabilization_s: 60
    traffic: {kind: diurnal, base_rps: 200, peak_rps: 1000, period_s: 900, noise: 0.2, seed: 3}
  - name: api
    replica: {cpu: 2, memory_gib: 4}
    capacity_rps: 50
    min_replicas: 1
    max_replicas: 40
    startup_delay_s: 10
    stabilization_s: 60
    traffic: {kind: points, points: [[0, 300], [300, 1200], [600, 200]]}
training:
  restart_cost_s: 10
  jobs:
    - {name_prefix: alpha, count: 3, interval_s: 0, trainer: {cpu: 2, memory_gib: 4},
       min_trainers: 2, max_trainers: 40, nominal_trainers: 10, pservers: 2,
       pserver: {cpu: 1, memory_gib: 2}, startup_delay_s: 10}
    - {name_prefix: beta, count: 3, interval_s: 0, trainer: {cpu: 1, memory_gib: 8},
       min_trainers: 1, max_trainers: 60, nominal_trainers: 20, startup_delay_s: 5}
    - {name_prefix: gamma, count: 2, interval_s: 0, trainer: {cpu: 4, memory_gib: 16, gpu: 1},
       min_trainers: 2, max_trainers: 8, pservers: 1, pserver: {cpu: 2, memory_gib: 4},
       startup_delay_s: 15, weight: 2}
"""


def _simulate(scenario: Path, hash_seed: str) -> dict[str, object]:
    environment = {**os.environ, "PYTHONHASHSEED": hash_seed}
    completed = subprocess.run(
        [
            sys.executable,
            "-m",
            "tideshift.services.cli",
            "simulate",
            "--scenario",
            str(scenario),
            "--json",
        ],
        capture_output=True,
        text=True,
        env=environment,
        timeout=300,
        check=False,
    )
    assert completed.returncode == 0, completed.stderr
    document: dict[str, object] = json.loads(completed.stdout)
    return document


@pytest.mark.slow
def test_simulate_json_is_identical_across_processes(tmp_path: Path) -> None:
    scenario = tmp_path / "reproducible.yaml"
    scenario.write_text(SCENARIO)
    first = _simulate(scenario, "1")
    second = _simulate(scenario, "2")
    policies = first["policies"]
    assert isinstance(policies, dict) and {"tideshift", "edl"} <= set(policies)
    assert policies["tideshift"]["trainer_churn"] > 0  # the run moved trainers at all
    assert first == second
