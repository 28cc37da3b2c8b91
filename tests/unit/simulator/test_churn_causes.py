"""Trainer churn split by what changed in the plan behind it (services/simulator/core/measures.py),
and a simulated run whose causes add up to its churn."""

from __future__ import annotations

from tideshift.services.cluster.port import WorkloadRef
from tideshift.services.planner.core import Target, TargetDecision
from tideshift.services.simulator.core.measures import ChurnCauses
from tideshift.services.simulator.run import run_policy
from tideshift.services.simulator.scenario import parse_scenario

JOB_A = WorkloadRef("ml", "ElasticJob", "a")
JOB_B = WorkloadRef("ml", "ElasticJob", "b")
WEB = Target("default", "Deployment", "web")


def serving(desired: int) -> TargetDecision:
    return TargetDecision(WEB, "serving", desired, desired, "test")


def test_each_steps_churn_counts_under_what_the_plan_before_it_saw_change() -> None:
    causes = ChurnCauses()
    causes.observe_plan([JOB_A], [serving(2)])  # the first plan: its job is new
    causes.count(10)
    causes.observe_plan([JOB_A], [serving(3)])  # same jobs, serving moved
    causes.count(14)
    causes.observe_plan([JOB_A], [serving(3)])  # nothing but training changed
    causes.count(15)
    causes.observe_jobs([JOB_A, JOB_B])  # an arrival between plans
    causes.count(18)
    causes.observe_plan([JOB_A, JOB_B], [serving(5)])  # the arrival beats a serving change
    causes.count(25)
    causes.count(27)  # pods binding later count under the latest plan's cause
    causes.observe_plan([JOB_A, JOB_B], [serving(4)])
    causes.count(30)
    assert causes.counts == {"jobs": 22, "serving": 7, "rebalancing": 1}


SCENARIO = """
name: causes
duration_s: 900
step_s: 5
plan_interval_s: 5
forecaster: {kind: oracle}
nodes:
  - {count: 2, cpu: 16, memory_gib: 64, name_prefix: cpu}
training:
  restart_cost_s: 5
  jobs:
    - {name_prefix: job, count: 3, arrival_s: 0, interval_s: 120, trainer: {cpu: 1, memory_gib: 1},
       min_trainers: 2, max_trainers: 32, work: 3000}
"""


def test_a_runs_causes_add_up_to_its_churn() -> None:
    result = run_policy(parse_scenario(SCENARIO), [], "tideshift")
    assert result.trainer_churn > 0
    assert sum(result.churn_causes.values()) == result.trainer_churn
    # No serving here: every trainer started or stopped follows an arrival, a finish or the
    # policy's own moves.
    assert result.churn_causes["serving"] == 0
    assert result.churn_causes["jobs"] > 0
