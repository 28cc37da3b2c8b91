"""Issue 26's measures: over-provisioning, cpu shares, job completion and queueing times,
weighted work; pure functions first, then through `tideshift simulate` with finite jobs."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from tideshift.services.planner.core.model import HeadroomParts, Target, TargetDecision
from tideshift.services.simulator import cli as simulate
from tideshift.services.simulator.core import measures as msr
from tideshift.services.simulator.report import plot_jct
from tideshift.services.simulator.run import run_policy
from tideshift.services.simulator.scenario import parse_scenario


def test_over_provisioning_and_cpu_shares_per_step() -> None:
    steps = msr.StepMeasures(("web", "api"), (10.0, 10.0))
    steps.add([10.0, 0.0], [20.0, 5.0], alloc_cpu=100.0, cpu=(50.0, 30.0, 10.0))
    steps.add([10.0, 4.0], [10.0, 8.0], alloc_cpu=100.0, cpu=(30.0, 30.0, 20.0))
    over = steps.over_provisioning()
    assert (over["web"]["mean"], over["web"]["p95"]) == (pytest.approx(1.5), pytest.approx(2.0))
    # A step without demand has no ratio: it does not count as infinite over-provisioning.
    assert (over["api"]["mean"], over["api"]["p95"]) == (pytest.approx(2.0), pytest.approx(2.0))
    assert steps.cpu_shares() == {
        "training": pytest.approx(0.4),
        "serving_reserved": pytest.approx(0.3),
        "serving_used": pytest.approx(0.15),
    }


def test_job_times_count_unfinished_jobs_to_the_end() -> None:
    outcomes = [
        msr.JobOutcome("small", arrival=0.0, started_at=0.0, finished_at=100.0),
        msr.JobOutcome("small", arrival=50.0, started_at=150.0, finished_at=350.0),
        msr.JobOutcome("gpu", arrival=100.0, started_at=None, finished_at=None),
    ]
    times = msr.job_times(outcomes, end=1000.0)
    assert times["finished"] == 2 and times["total"] == 3
    assert times["jct_s"]["mean"] == pytest.approx((100 + 300 + 900) / 3)
    assert times["queueing_s"]["p50"] == pytest.approx(100.0)
    # One job never finished: the makespan runs to the end of the run.
    assert times["makespan_s"] == pytest.approx(1000.0)
    assert times["groups"]["gpu"]["queueing_s"]["mean"] == pytest.approx(900.0)
    assert times["groups"]["small"]["jct_s"]["p95"] == pytest.approx(300.0)
    finished = msr.job_times(outcomes[:2], end=1000.0)
    assert finished["makespan_s"] == pytest.approx(350.0)
    assert msr.job_times([], end=10.0) == {}


def test_a_gpu_trainer_weighs_its_dominant_share_in_cores() -> None:
    cluster = np.array([64.0, 256.0, 8.0])
    assert msr.dominant_cores((4.0, 16.0, 1.0), cluster) == pytest.approx(8.0)
    assert msr.dominant_cores((2.0, 4.0, 0.0), cluster) == pytest.approx(2.0)
    # Without GPUs in the cluster the GPU column is ignored, not divided by zero.
    assert msr.dominant_cores((2.0, 4.0, 0.0), np.array([64.0, 256.0, 0.0])) == 2.0


FINITE = """
name: finite
duration_s: 3600
step_s: 5
plan_interval_s: 15
forecaster: {kind: oracle}
nodes:
  - {count: 4, cpu: 8, memory_gib: 32}
  - {count: 1, cpu: 8, memory_gib: 32, gpu: 2, name_prefix: gpu}
serving:
  - name: web
    replica: {cpu: 1, memory_gib: 1}
    capacity_rps: 10
    target_utilization: 0.8
    min_replicas: 1
    max_replicas: 30
    startup_delay_s: 10
    stabilization_s: 60
    traffic: {kind: points, points: [[0, 40], [1200, 160], [2400, 40]]}
training:
  jobs:
    - {name_prefix: small, count: 6, interval_s: 120, trainer: {cpu: 1, memory_gib: 1},
       min_trainers: 1, max_trainers: 8, nominal_trainers: 2, pservers: 0,
       startup_delay_s: 5, work: 600}
    - {name_prefix: gpu, count: 2, interval_s: 300, trainer: {cpu: 1, memory_gib: 1, gpu: 1},
       min_trainers: 1, max_trainers: 2, nominal_trainers: 1, pservers: 0,
       startup_delay_s: 5, work: 900}
"""


def test_simulate_reports_job_times_per_group(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    scenario = tmp_path / "finite.yaml"
    scenario.write_text(FINITE)
    argv = ["--scenario", str(scenario), "--policy", "static", "--policy", "tideshift"]
    assert simulate.main([*argv, "--json"]) == 0
    policies = json.loads(capsys.readouterr().out)["policies"]
    for metrics in policies.values():
        jobs = metrics["jobs"]
        assert set(jobs["groups"]) == {"small", "gpu"}
        assert jobs["total"] == 8 and 0 < jobs["finished"] <= 8
        assert 0 < jobs["jct_s"]["p50"] <= jobs["jct_s"]["p95"] <= 3600
        assert jobs["queueing_s"]["mean"] <= jobs["jct_s"]["mean"]
        over = metrics["over_provisioning"]["web"]
        assert over["mean"] >= 1.0 and over["p95"] >= 1.0
        shares = metrics["cpu_shares"]
        assert 0 < shares["serving_used"] <= shares["serving_reserved"] < 1
        assert 0 < shares["training"] < 1
        # GPU steps weigh more than cpu ones: weighted work exceeds plain work.
        assert metrics["weighted_work"] > metrics["training_work"]
    # The static partition holds serving at its peak all run: more over-provisioned.
    static, tideshift = policies["static"], policies["tideshift"]
    assert (
        static["over_provisioning"]["web"]["mean"] > tideshift["over_provisioning"]["web"]["mean"]
    )
    assert simulate.main(argv) == 0
    table = capsys.readouterr().out
    assert "jct mean" in table and "over-provisioning" in table and "rise rep-h" in table
    assert not math.isnan(static["jobs"]["makespan_s"])


def test_jct_cdf_plot_has_one_curve_per_policy(tmp_path: Path) -> None:
    scenario = parse_scenario(FINITE, "finite.yaml")
    profiles = [spec.traffic.profile(tmp_path, None) for spec in scenario.serving]
    results = [run_policy(scenario, profiles, name) for name in ("static", "edl")]
    path = plot_jct(results, scenario, tmp_path / "plots")
    assert path is not None and path.name == "finite-jct-cdf.png" and path.stat().st_size > 0
    no_jobs = parse_scenario(FINITE.split("training:", maxsplit=1)[0], "none.yaml")
    assert plot_jct([run_policy(no_jobs, profiles, "static")], no_jobs, tmp_path) is None


def test_headroom_parts_are_priced_in_replica_hours() -> None:
    steps = msr.StepMeasures(("web",), (10.0,))
    web = Target("default", "Deployment", "web")
    parts = HeadroomParts(forecast=41.0, rise=65.0, rise_ratio=1.3, observed=50.0, panic_hold=False)
    # forecast alone: 5 replicas; the rise adds 2 (7); observed (5) adds none; 1 more held.
    steps.add_plan([TargetDecision(web, "serving", 6, 8, "sized", parts)], held_s=1800.0)
    # A decision without parts (a baseline, or a training target) prices nothing.
    steps.add_plan([TargetDecision(web, "serving", 8, 8, "held")], held_s=1800.0)
    assert steps.over_provisioning()["web"]["replica_h"] == {
        "forecast": pytest.approx(2.5),
        "rise": pytest.approx(1.0),
        "observed": 0.0,
        "held": pytest.approx(0.5),
    }
