"""No job left behind (issue 39, item 4): `simulate` counts the job-hours a job spent with no
trainer while its fair share was positive, in the report and in --json."""

from __future__ import annotations

import pytest

from tideshift.services.simulator.report import format_table
from tideshift.services.simulator.run import run_policy
from tideshift.services.simulator.scenario import parse_scenario

# Two jobs of 20 trainers each on 32 cores: a policy that runs each at its nominal 20 can run
# only the first; the second's fair share (16 cores, gang 2) is positive all along.
SCENARIO = """
name: left-behind
duration_s: 1800
step_s: 5
plan_interval_s: 15
forecaster: {kind: oracle}
nodes:
  - {count: 2, cpu: 16, memory_gib: 64, name_prefix: cpu}
training:
  restart_cost_s: 5
  jobs:
    - {name_prefix: job, count: 2, arrival_s: 0, interval_s: 60, trainer: {cpu: 1, memory_gib: 1},
       min_trainers: 2, max_trainers: 20, nominal_trainers: 20}
"""


@pytest.mark.parametrize("policy", ["static", "tideshift"])
def test_a_job_with_a_positive_share_and_no_trainer_is_counted(policy: str) -> None:
    result = run_policy(parse_scenario(SCENARIO), [], policy)
    summary = result.summary()
    if policy == "static":  # the second job waits for its 20 trainers the whole run
        assert result.left_behind_h["job-1"] == pytest.approx((1800 - 60) / 3600, abs=0.02)
        assert summary["job_hours_left_behind"] == round(result.job_hours_left_behind, 3)
        assert summary["job_hours_left_behind_by_job"] == {"job-1": pytest.approx(0.483, abs=0.02)}
    else:  # elastic: both run, none left behind
        assert result.job_hours_left_behind == 0
        assert summary["job_hours_left_behind_by_job"] == {}
    assert "job-h left behind" in format_table([result])
