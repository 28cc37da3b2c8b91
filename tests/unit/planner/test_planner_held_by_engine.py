"""A workload another engine keeps the size of (an admitted Kueue job without workload slices)
is held where it is, with the engine's reason as the plan's; freed, it is planned again."""

from __future__ import annotations

from datetime import UTC, datetime

from tideshift.events import Resources, TrainingPolicy, WorkloadChanged, WorkloadRef
from tideshift.services.planner.core.targets import TargetBook

NOW = datetime(2026, 3, 1, 12, tzinfo=UTC)
JOB = WorkloadRef("ml", "PyTorchJob.kubeflow.org", "queued")
WHY = "size left to Kueue: admitted through 'train'; Kueue v0.17 has no workload slices"


def job(held_by: str) -> WorkloadChanged:
    return WorkloadChanged(
        change="modified",
        workload=JOB,
        role="training",
        replicas=3,
        requests=Resources(cpu=1.0),
        training=TrainingPolicy(),
        held_by=held_by,
        observed_at=NOW,
    )


def test_a_job_kueue_keeps_the_size_of_is_held_with_kueue_s_reason() -> None:
    book = TargetBook()
    book.apply(job(WHY))
    targets = book.targets({}, NOW)
    assert targets.jobs == ()
    (held,) = targets.held
    assert (held.target, held.current, held.desired, held.reason) == (JOB, 3, 3, WHY)
    book.apply(job(""))
    assert [j.target for j in book.targets({}, NOW).jobs] == [JOB]
