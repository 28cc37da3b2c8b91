"""An announced job's work model (TrainingPolicy restart_cost_seconds, speedup_exponent) is
what the planner weighs its moves with (TrainingJob restart_cost_s, speedup_exponent); without
them the planner's defaults; a job listed in the settings says them as restart_cost_s and
speedup_exponent."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from pydantic import ValidationError

from tideshift.events import Resources, TrainingPolicy, WorkloadChanged, WorkloadRef
from tideshift.events.models import DEFAULT_RESTART_COST_S, DEFAULT_SPEEDUP_EXPONENT
from tideshift.services.planner.core.targets import TargetBook
from tideshift.services.planner.settings import TrainingTarget

NOW = datetime(2026, 3, 1, 12, tzinfo=UTC)
CTR = WorkloadRef("ml", "PyTorchJob.kubeflow.org", "ctr")


def planned(policy: TrainingPolicy) -> tuple[float, float]:
    book = TargetBook()
    book.apply(
        WorkloadChanged(
            change="added",
            workload=CTR,
            role="training",
            replicas=4,
            requests=Resources(cpu=2.0),
            training=policy,
            observed_at=NOW,
        )
    )
    (job,) = book.targets({}, NOW).jobs
    return job.restart_cost_s, job.speedup_exponent


def test_the_jobs_own_work_model_is_planned_with() -> None:
    assert planned(TrainingPolicy(restart_cost_seconds=240.0, speedup_exponent=0.5)) == (
        240.0,
        0.5,
    )
    assert planned(TrainingPolicy(restart_cost_seconds=0.0)) == (0.0, DEFAULT_SPEEDUP_EXPONENT)


def test_without_it_the_planners_defaults() -> None:
    assert planned(TrainingPolicy()) == (DEFAULT_RESTART_COST_S, DEFAULT_SPEEDUP_EXPONENT)


def test_a_settings_job_says_its_own_work_model() -> None:
    target = TrainingTarget(
        namespace="ml", name="ctr", cpu=1.0, max_trainers=8, restart_cost_s=600.0
    )
    job = target.job(0.0)
    assert (job.restart_cost_s, job.speedup_exponent) == (600.0, DEFAULT_SPEEDUP_EXPONENT)
    with pytest.raises(ValidationError) as caught:
        TrainingTarget(namespace="ml", name="ctr", cpu=1.0, max_trainers=8, restart_cost_s=7200)
    assert caught.value.errors()[0]["loc"] == ("restart_cost_s",)
