"""A labelled workload's policy, read from its `tideshift.io/*` annotations. Pure: no I/O.

Which annotations there are, their defaults and what each expects are declared once, on the
workload specs in the contract (`ServingPolicy`, `TrainingPolicy` in events/models.py: each
field names its annotation in its metadata); this parser reads every annotated field of the
role's spec alike. Serving workloads (`tideshift.io/role: serving`) require `capacity-rps`.
A training job's `batch` (`"true"`: its trainers borrow serving's idle reservation through the
`tideshift.io/batch-cpu` / `batch-memory` their pod template requests, which become the
announced requests). Any workload: `paused` (`"true"`: Tideshift leaves it alone). A value
that does not parse raises `InvalidPolicy` naming the annotation and what it expects.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import TypeVar

from pydantic import ValidationError

from tideshift.events import (
    Resources,
    ServingPolicy,
    TrainingPolicy,
    WorkloadChanged,
)
from tideshift.events.models import ANNOTATION_PREFIX, annotation_fields
from tideshift.services.cluster.core.overcommit import BATCH_CPU, BATCH_MEMORY
from tideshift.services.cluster.port import ChangeType, Workload

PREFIX = ANNOTATION_PREFIX
PAUSED = f"{PREFIX}paused"


class InvalidPolicy(ValueError):
    """An annotation that cannot be read; the message names it and what it expects."""


Policy = TypeVar("Policy", ServingPolicy, TrainingPolicy)


def _numeric(model: type[ServingPolicy | TrainingPolicy], field: str) -> bool:
    """Whether a field is read as a number (int or float, optional or not)."""
    annotation = model.model_fields[field].annotation
    return annotation in (int, float, int | None, float | None)


def _policy(model: type[Policy], annotations: Mapping[str, str]) -> Policy:
    fields = annotation_fields(model)  # annotation -> (field, expected)
    values = {
        field: annotations[annotation]
        for annotation, (field, _) in fields.items()
        if annotation in annotations
    }
    by_field = {field: (annotation, expected) for annotation, (field, expected) in fields.items()}
    for field, value in values.items():
        # Python's number syntax (pydantic's too) reads "1_0" as 10: not what a person meant.
        if _numeric(model, field) and "_" in value:
            annotation, expected = by_field[field]
            raise InvalidPolicy(f"{annotation}={value!r}: expected {expected}")
    try:
        return model.model_validate(values)
    except ValidationError as error:
        first = error.errors()[0]
        field = str(first["loc"][0]) if first["loc"] else ""
        if field not in by_field:  # a check across fields (max below min)
            raise InvalidPolicy(str(first["msg"]).removeprefix("Value error, ")) from None
        annotation, expected = by_field[field]
        if first["type"] == "missing":
            raise InvalidPolicy(
                f"{annotation} is required for a {_role(model)} workload: expected {expected}"
            ) from None
        raise InvalidPolicy(f"{annotation}={values.get(field)!r}: expected {expected}") from None


def _role(model: type[ServingPolicy | TrainingPolicy]) -> str:
    return "serving" if model is ServingPolicy else "training"


def _paused(annotations: Mapping[str, str]) -> bool:
    value = annotations.get(PAUSED, "false").strip().lower()
    if value not in ("true", "false"):
        raise InvalidPolicy(f'{PAUSED}={annotations[PAUSED]!r}: expected "true" or "false"')
    return value == "true"


def _check_batch(workload: Workload) -> None:
    """A batch job's trainers are sized by what their template borrows: some batch cpu, and
    no GPU (GPUs are not lent)."""
    if workload.requests.gpu > 0:
        raise InvalidPolicy(
            f'{PREFIX}batch="true": GPUs are not lent; expected trainers requesting no gpu '
            f"(its template requests {workload.requests.gpu})"
        )
    if workload.batch_requests.cpu <= 0:
        raise InvalidPolicy(
            f'{PREFIX}batch="true": expected its pod template to request {BATCH_CPU} '
            f"(millicores) and {BATCH_MEMORY} instead of cpu and memory; it requests none"
        )


def workload_event(
    change: ChangeType, workload: Workload, *, observed_at: datetime
) -> WorkloadChanged:
    """The event for a labelled workload; raises InvalidPolicy for an unreadable annotation."""
    if workload.unscalable:
        raise InvalidPolicy(workload.unscalable)
    annotations = dict(workload.annotations)
    serving: ServingPolicy | None = None
    training: TrainingPolicy | None = None
    if workload.role == "serving":
        serving = _policy(ServingPolicy, annotations)
    else:
        training = _policy(TrainingPolicy, annotations)
    requests = workload.requests
    if training is not None and training.batch:
        _check_batch(workload)
        requests = workload.batch_requests
    return WorkloadChanged(
        change=change,
        workload=workload.ref,
        role="serving" if workload.role == "serving" else "training",
        replicas=workload.replicas,
        ready_replicas=workload.ready_replicas,
        min_replicas=workload.min_replicas,
        max_replicas=workload.max_replicas,
        requests=Resources(
            cpu=max(requests.cpu, 0.0), memory=max(requests.memory, 0.0), gpu=requests.gpu
        ),
        serving=serving,
        training=training,
        paused=_paused(annotations),
        # Sent only when set: a reader one release older does not know the field (codec.py).
        **({"held_by": workload.held_by[:500]} if workload.held_by else {}),
        resource_version=workload.resource_version,
        observed_at=observed_at,
    )
