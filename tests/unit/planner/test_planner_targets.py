"""The planner's targets: static settings plus announced workloads, pins and paused ones held."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from tideshift.events import (
    Resources,
    ScalePin,
    ServingPolicy,
    TrainingPolicy,
    WorkloadChanged,
    WorkloadRef,
)
from tideshift.services.planner.core import ServingWorkload
from tideshift.services.planner.core.targets import TargetBook

NOW = datetime(2026, 3, 1, 12, tzinfo=UTC)
WEB = WorkloadRef("shop", "Deployment.apps", "web")
CTR = WorkloadRef("ml", "Job.batch.volcano.sh", "ctr")


def serving(change: str = "added", *, at: datetime = NOW, **policy: object) -> WorkloadChanged:
    return WorkloadChanged(
        change=change,  # type: ignore[arg-type]
        workload=WEB,
        role="serving",
        replicas=2,
        requests=Resources(cpu=0.5),
        serving=ServingPolicy(capacity_rps=50, **policy),  # type: ignore[arg-type]
        observed_at=at,
    )


def training(
    change: str = "added", *, replicas: int = 6, paused: bool = False, own_min: int = 2
) -> WorkloadChanged:
    return WorkloadChanged(
        change=change,  # type: ignore[arg-type]
        workload=CTR,
        role="training",
        replicas=replicas,
        min_replicas=own_min,
        requests=Resources(cpu=2.0, memory=2**30),
        training=TrainingPolicy(priority=3, gang_min=2),
        paused=paused,
        observed_at=NOW,
    )


def test_announced_workloads_are_planned_and_forgotten_on_removal() -> None:
    book = TargetBook()
    assert book.apply(serving(min_replicas=2, max_replicas=9))
    assert book.apply(training())
    targets = book.targets({}, NOW)
    (web,) = targets.serving
    (ctr,) = targets.jobs
    assert (web.target, web.capacity_rps, web.min_replicas, web.max_replicas) == (WEB, 50, 2, 9)
    assert web.replica_requests == (0.5, 0.0, 0.0)
    # No maximum anywhere: the size it was submitted with; its own gang minimum holds.
    assert (ctr.min_trainers, ctr.max_trainers, ctr.gang_min, ctr.priority) == (2, 6, 2, 3)
    assert book.apply(training("deleted"))
    assert book.targets({}, NOW).jobs == ()


def test_an_announced_batch_job_is_planned_as_one() -> None:
    book = TargetBook()
    plain = training()
    assert book.apply(plain)
    assert not book.targets({}, NOW).jobs[0].batch
    policy = TrainingPolicy(priority=3, gang_min=2, batch=True)
    book.apply(plain.model_copy(update={"training": policy, "observed_at": NOW + timedelta(1)}))
    (job,) = book.targets({}, NOW).jobs
    assert job.batch and job.trainer_requests == (2.0, 2**30, 0.0)


def test_an_older_announcement_loses_to_a_newer_one() -> None:
    book = TargetBook()
    book.apply(serving(max_replicas=9))
    assert not book.apply(serving(at=NOW - timedelta(seconds=5), max_replicas=3))
    assert book.targets({}, NOW).serving[0].max_replicas == 9


def test_static_settings_win_over_an_announcement_of_the_same_target() -> None:
    static = ServingWorkload(target=WEB, replica_requests=(1.0, 0.0, 0.0), capacity_rps=10)
    book = TargetBook(static_serving=(static,))
    book.apply(serving())
    assert book.targets({}, NOW).serving == (static,)


def test_pinned_and_paused_targets_are_held_with_their_reason() -> None:
    book = TargetBook()
    book.apply(serving())
    book.apply(training(paused=True))
    pin = ScalePin(target=WEB, replicas=7, until=NOW + timedelta(minutes=5), pinned_at=NOW)
    targets = book.targets({WEB: pin}, NOW)
    assert targets.serving == () and targets.jobs == ()
    held = {h.target: h for h in targets.held}
    assert (held[WEB].current, held[WEB].desired) == (2, 7)
    assert "pinned at 7 by the operator" in held[WEB].reason
    assert (held[CTR].current, held[CTR].desired) == (6, 6)
    assert "tideshift.io/paused" in held[CTR].reason
    # An expired pin holds nothing: the planner resumes control.
    later = book.targets({WEB: pin}, NOW + timedelta(minutes=6))
    assert [w.target for w in later.serving] == [WEB]


def test_announcements_past_the_limit_are_refused_and_counted_until_one_is_removed() -> None:
    book = TargetBook(limit=1)
    assert book.apply(serving())
    assert not book.apply(training())  # a newcomer past the limit
    assert book.apply(serving(at=NOW + timedelta(seconds=1)))  # one held may still change
    assert [w.target for w in book.targets({}, NOW).serving] == [WEB]
    assert book.targets({}, NOW).jobs == ()
    assert book.take_refused() == 1
    assert book.take_refused() == 0  # taken once

    assert book.apply(serving("deleted", at=NOW + timedelta(seconds=2)))
    assert book.apply(training())  # room again
    assert [j.target for j in book.targets({}, NOW).jobs] == [CTR]
