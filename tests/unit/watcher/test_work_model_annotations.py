"""A training job's work model from its annotations (`tideshift.io/restart-cost-seconds`,
`speedup-exponent`): through the watcher's conversion into the TrainingPolicy event, bounded,
each bad value named with what it expects."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from tideshift.events import WorkloadRef
from tideshift.services.cluster.port import Resources, Workload
from tideshift.services.watcher.core.annotations import InvalidPolicy, workload_event

AT = datetime(2026, 3, 1, tzinfo=UTC)


def job(**annotations: str) -> Workload:
    return Workload(
        ref=WorkloadRef("ml", "PyTorchJob.kubeflow.org", "ctr"),
        role="training",
        replicas=4,
        ready_replicas=4,
        min_replicas=0,
        max_replicas=None,
        requests=Resources(cpu=2.0, memory=2**30, gpu=0),
        annotations=tuple(sorted((f"tideshift.io/{k}", v) for k, v in annotations.items())),
    )


def test_the_work_model_annotations_become_its_policy() -> None:
    event = workload_event(
        "added", job(**{"restart-cost-seconds": "120", "speedup-exponent": "0.6"}), observed_at=AT
    )
    assert event.training is not None
    assert event.training.restart_cost_seconds == 120.0
    assert event.training.speedup_exponent == 0.6


def test_without_them_the_planner_keeps_its_defaults() -> None:
    event = workload_event("added", job(), observed_at=AT)
    assert event.training is not None
    assert event.training.restart_cost_seconds is None
    assert event.training.speedup_exponent is None


@pytest.mark.parametrize(
    ("annotations", "message"),
    [
        ({"restart-cost-seconds": "-5"}, "tideshift.io/restart-cost-seconds='-5': expected sec"),
        ({"restart-cost-seconds": "7200"}, "'7200': expected seconds >= 0 and <= 3600"),
        ({"restart-cost-seconds": "nan"}, "tideshift.io/restart-cost-seconds='nan'"),
        ({"restart-cost-seconds": "1_0"}, "tideshift.io/restart-cost-seconds='1_0'"),
        ({"restart-cost-seconds": "slow"}, "tideshift.io/restart-cost-seconds='slow'"),
        ({"speedup-exponent": "0"}, "tideshift.io/speedup-exponent='0': expected a number > 0"),
        ({"speedup-exponent": "1.5"}, "tideshift.io/speedup-exponent='1.5': expected"),
        ({"speedup-exponent": "inf"}, "tideshift.io/speedup-exponent='inf'"),
    ],
)
def test_a_bad_value_names_the_annotation_and_what_it_expects(
    annotations: dict[str, str], message: str
) -> None:
    with pytest.raises(InvalidPolicy) as caught:
        workload_event("added", job(**annotations), observed_at=AT)
    assert message in str(caught.value)
