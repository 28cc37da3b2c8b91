"""A labelled workload's annotations -> its WorkloadChanged event, or a message naming the
annotation and what it expects."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from tideshift.events import WorkloadRef
from tideshift.services.cluster.adapters.targets import VolcanoJobAdapter
from tideshift.services.cluster.core.conversions import workload_from_object
from tideshift.services.cluster.port import Resources, Role, Workload
from tideshift.services.watcher.core.annotations import InvalidPolicy, workload_event

AT = datetime(2026, 3, 1, tzinfo=UTC)


def workload(role: Role, kind: str = "Deployment.apps", **annotations: str) -> Workload:
    return Workload(
        ref=WorkloadRef("shop", kind, "web"),
        role=role,
        replicas=3,
        ready_replicas=2,
        min_replicas=0,
        max_replicas=None,
        requests=Resources(cpu=0.5, memory=2**28, gpu=0),
        annotations=tuple(sorted((f"tideshift.io/{k}", v) for k, v in annotations.items())),
    )


def test_serving_annotations_become_its_policy() -> None:
    event = workload_event(
        "added",
        workload(
            "serving",
            **{
                "capacity-rps": "40",
                "min-replicas": "2",
                "max-replicas": "30",
                "lead-time-seconds": "45",
                "quantile": "0.9",
                "demand-query": 'sum(rate(http_requests_total{app="web"}[1m]))',
            },
        ),
        observed_at=AT,
    )
    assert event.serving is not None and event.training is None
    assert (event.serving.capacity_rps, event.serving.min_replicas) == (40.0, 2)
    assert (event.serving.max_replicas, event.serving.lead_time_seconds) == (30, 45.0)
    assert event.serving.quantile == 0.9 and "http_requests_total" in event.serving.demand_query
    assert (event.replicas, event.ready_replicas, event.requests.cpu) == (3, 2, 0.5)
    assert not event.paused


def test_training_annotations_become_its_policy_with_defaults() -> None:
    event = workload_event(
        "modified",
        workload(
            "training",
            "Job.batch.volcano.sh",
            **{"gang-min": "2", "priority": "-5", "scale-task": "trainer", "paused": "true"},
        ),
        observed_at=AT,
    )
    assert event.training is not None and event.serving is None
    assert (event.training.gang_min, event.training.priority) == (2, -5)
    assert (event.training.min_replicas, event.training.max_replicas) == (1, None)
    assert event.training.scale_task == "trainer" and event.training.weight == 1.0
    assert event.paused and event.workload.kind == "Job.batch.volcano.sh"


@pytest.mark.parametrize(
    ("role", "annotations", "message"),
    [
        ("serving", {}, "tideshift.io/capacity-rps is required for a serving workload"),
        ("serving", {"capacity-rps": "lots"}, "tideshift.io/capacity-rps='lots': expected a num"),
        ("serving", {"capacity-rps": "-1"}, "tideshift.io/capacity-rps='-1'"),
        ("serving", {"capacity-rps": "5", "quantile": "95"}, "tideshift.io/quantile='95'"),
        ("serving", {"capacity-rps": "5", "min-replicas": "3", "max-replicas": "2"}, ">= min"),
        ("training", {"gang-min": "0"}, "tideshift.io/gang-min='0': expected a whole number"),
        ("training", {"weight": "heavy"}, "tideshift.io/weight='heavy': expected a number > 0"),
        ("training", {"min-replicas": "2.5"}, "tideshift.io/min-replicas='2.5'"),
        # Python's number syntax would read these as 10 and 1000
        ("serving", {"capacity-rps": "1_0"}, "tideshift.io/capacity-rps='1_0': expected a num"),
        ("training", {"max-replicas": "1_000"}, "tideshift.io/max-replicas='1_000'"),
        ("training", {"paused": "yes"}, "tideshift.io/paused='yes': expected \"true\" or"),
        ("training", {"batch": "maybe"}, "tideshift.io/batch='maybe': expected \"true\" or"),
        # Batch trainers are sized by what they borrow; this template borrows nothing.
        ("training", {"batch": "true"}, "request tideshift.io/batch-cpu (millicores)"),
    ],
)
def test_unreadable_annotations_name_the_annotation_and_what_it_expects(
    role: Role, annotations: dict[str, str], message: str
) -> None:
    with pytest.raises(InvalidPolicy) as caught:
        workload_event("added", workload(role, **annotations), observed_at=AT)
    assert message in str(caught.value)


def test_a_scale_task_that_names_no_task_is_reported_like_a_bad_annotation() -> None:
    job = {
        "metadata": {
            "name": "ctr",
            "namespace": "ml",
            "labels": {"tideshift.io/role": "training"},
            "annotations": {"tideshift.io/scale-task": "trainers"},
        },
        "spec": {"tasks": [{"name": "pserver", "replicas": 2}, {"name": "trainer", "replicas": 4}]},
    }
    announced = workload_from_object(VolcanoJobAdapter(), job)
    assert announced.ref == WorkloadRef("ml", "Job.batch.volcano.sh", "ctr")
    with pytest.raises(InvalidPolicy, match=r"tideshift\.io/scale-task='trainers' names no task"):
        workload_event("added", announced, observed_at=AT)


def volcano_job(trainer_requests: dict[str, str], **annotations: str) -> dict[str, object]:
    return {
        "metadata": {
            "name": "nightly",
            "namespace": "ml",
            "labels": {"tideshift.io/role": "training"},
            "annotations": {f"tideshift.io/{k}": v for k, v in annotations.items()},
        },
        "spec": {
            "tasks": [
                {
                    "name": "worker",
                    "replicas": 4,
                    "template": {
                        "spec": {"containers": [{"resources": {"requests": trainer_requests}}]}
                    },
                }
            ]
        },
    }


def test_a_batch_job_announces_what_its_trainers_borrow() -> None:
    borrowing = {"tideshift.io/batch-cpu": "1500", "tideshift.io/batch-memory": "2Gi"}
    job = workload_from_object(VolcanoJobAdapter(), volcano_job(borrowing, batch="true"))
    assert job.requests == Resources() and job.batch_requests == Resources(1.5, 2 * 2**30)
    event = workload_event("added", job, observed_at=AT)
    assert event.training is not None and event.training.batch
    assert (event.requests.cpu, event.requests.memory, event.requests.gpu) == (1.5, 2 * 2**30, 0)
    # Not opted in, the same template's cpu request is what is announced: none.
    plain = workload_event(
        "added",
        workload_from_object(VolcanoJobAdapter(), volcano_job(borrowing)),
        observed_at=AT,
    )
    assert plain.training is not None and not plain.training.batch
    assert plain.requests.cpu == 0.0


def test_a_batch_job_asking_for_gpus_is_refused_by_name() -> None:
    template = {"tideshift.io/batch-cpu": "1000", "nvidia.com/gpu": "1"}
    job = workload_from_object(VolcanoJobAdapter(), volcano_job(template, batch="true"))
    with pytest.raises(InvalidPolicy, match=r'tideshift\.io/batch="true": GPUs are not lent'):
        workload_event("added", job, observed_at=AT)
