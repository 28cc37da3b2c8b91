"""The annotation parser is derived from the workload specs (events/models.py): every field of
ServingPolicy and TrainingPolicy names its annotation, each one parses into its field, and a
bad value is reported under that annotation with what its field expects. The target
utilisation `simulate` and the demo plan at is reachable by annotation."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from tideshift.events import ServingPolicy, TrainingPolicy, WorkloadRef
from tideshift.events.models import annotation_fields, annotation_of
from tideshift.services.cluster.port import Resources, Role, Workload
from tideshift.services.planner.core.targets import serving_of
from tideshift.services.simulator.scenario import SIMULATED_TARGET_UTILIZATION
from tideshift.services.watcher.core.annotations import InvalidPolicy, workload_event

AT = datetime(2026, 3, 1, tzinfo=UTC)


def workload(role: Role, annotations: dict[str, str]) -> Workload:
    return Workload(
        ref=WorkloadRef("shop", "Deployment.apps", "web"),
        role=role,
        replicas=3,
        ready_replicas=3,
        min_replicas=0,
        max_replicas=None,
        requests=Resources(cpu=1.0, memory=2**30, gpu=0),
        annotations=tuple(sorted(annotations.items())),
    )


@pytest.mark.parametrize("spec", [ServingPolicy, TrainingPolicy])
def test_every_spec_field_names_its_annotation(spec: type[ServingPolicy | TrainingPolicy]) -> None:
    fields = {field for field, _ in annotation_fields(spec).values()}
    assert fields == set(spec.model_fields)
    for annotation, (_, expected) in annotation_fields(spec).items():
        assert annotation.startswith("tideshift.io/") and expected


def test_margin_and_target_utilization_are_read_from_annotations() -> None:
    annotations = {
        annotation_of(ServingPolicy, "capacity_rps"): "40",
        annotation_of(ServingPolicy, "margin_seconds"): "90",
        annotation_of(ServingPolicy, "target_utilization"): str(SIMULATED_TARGET_UTILIZATION),
    }
    event = workload_event("added", workload("serving", annotations), observed_at=AT)
    planned = serving_of(event)
    assert (planned.margin_s, planned.target_utilization) == (90.0, SIMULATED_TARGET_UTILIZATION)


def test_unannotated_fields_take_the_spec_defaults() -> None:
    event = workload_event(
        "added", workload("serving", {"tideshift.io/capacity-rps": "40"}), observed_at=AT
    )
    planned = serving_of(event)
    defaults = ServingPolicy(capacity_rps=40.0)
    assert (planned.margin_s, planned.target_utilization, planned.lead_time_s) == (
        defaults.margin_seconds,
        defaults.target_utilization,
        defaults.lead_time_seconds,
    )
    assert defaults.target_utilization == 1.0


@pytest.mark.parametrize("value", ["0", "1.5", "most", "0_8"])
def test_a_bad_target_utilization_names_the_annotation(value: str) -> None:
    annotations = {"tideshift.io/capacity-rps": "40", "tideshift.io/target-utilization": value}
    with pytest.raises(InvalidPolicy) as error:
        workload_event("added", workload("serving", annotations), observed_at=AT)
    assert str(error.value) == (
        f"tideshift.io/target-utilization={value!r}: expected a fraction > 0 and <= 1, e.g. 0.8"
    )
