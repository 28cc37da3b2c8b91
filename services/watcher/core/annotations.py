"""A labelled workload's policy, read from its `tideshift.io/*` annotations. Pure: no I/O.

Serving workloads (`tideshift.io/role: serving`): `capacity-rps` (required), `min-replicas`,
`max-replicas`, `lead-time-seconds`, `quantile`, `stabilization-seconds`, `demand-query`.
Training workloads (`tideshift.io/role: training`): `min-replicas`, `max-replicas`,
`gang-min`, `priority`, `weight`, `scale-task` (Volcano), `batch` (`"true"`: its trainers
borrow serving's idle reservation through the `tideshift.io/batch-cpu` / `batch-memory` their
pod template requests, which become the announced requests), `restart-cost-seconds` and
`speedup-exponent` (its work model: seconds without progress after its trainers change, and
throughput growing as trainers ** exponent; what the planner weighs moves against). Any
workload: `paused`
(`"true"`: Tideshift leaves it alone). A value that does not parse raises `InvalidPolicy`
naming the annotation and what it expects.
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
from tideshift.events.models import MAX_RESTART_COST_S
from tideshift.services.cluster.core.overcommit import BATCH_CPU, BATCH_MEMORY
from tideshift.services.cluster.port import ChangeType, Workload

PREFIX = "tideshift.io/"
PAUSED = f"{PREFIX}paused"

# annotation (after the prefix) -> policy field, per role
SERVING_ANNOTATIONS = {
    "capacity-rps": "capacity_rps",
    "min-replicas": "min_replicas",
    "max-replicas": "max_replicas",
    "lead-time-seconds": "lead_time_seconds",
    "quantile": "quantile",
    "stabilization-seconds": "stabilization_seconds",
    "demand-query": "demand_query",
}
TRAINING_ANNOTATIONS = {
    "min-replicas": "min_replicas",
    "max-replicas": "max_replicas",
    "gang-min": "gang_min",
    "priority": "priority",
    "weight": "weight",
    "scale-task": "scale_task",
    "batch": "batch",
    "restart-cost-seconds": "restart_cost_seconds",
    "speedup-exponent": "speedup_exponent",
}
# What each field expects, in words for the message on the object.
EXPECTED = {
    "capacity_rps": "a number of requests/s > 0",
    "min_replicas": "a whole number >= 0 (training: >= 1)",
    "max_replicas": "a whole number >= 1, not below min-replicas",
    "lead_time_seconds": "seconds >= 0",
    "quantile": "a number between 0 and 1, e.g. 0.95",
    "stabilization_seconds": "seconds >= 0",
    "demand_query": "a PromQL expression",
    "gang_min": "a whole number >= 1",
    "priority": "a whole number",
    "weight": "a number > 0",
    "scale_task": "the name of one of the job's tasks",
    "batch": '"true" or "false"',
    "restart_cost_seconds": f"seconds >= 0 and <= {MAX_RESTART_COST_S:.0f}",
    "speedup_exponent": "a number > 0 and <= 1, e.g. 0.8",
}


# Fields read as numbers (the others are text or a boolean).
_NUMBERS = frozenset(EXPECTED) - {"demand_query", "scale_task", "batch"}


class InvalidPolicy(ValueError):
    """An annotation that cannot be read; the message names it and what it expects."""


Policy = TypeVar("Policy", ServingPolicy, TrainingPolicy)


def _policy(
    model: type[Policy], names: Mapping[str, str], annotations: Mapping[str, str]
) -> Policy:
    values = {
        field: annotations[PREFIX + name]
        for name, field in names.items()
        if PREFIX + name in annotations
    }
    for field, value in values.items():
        # Python's number syntax (pydantic's too) reads "1_0" as 10: not what a person meant.
        if field in _NUMBERS and "_" in value:
            named = next(PREFIX + n for n, f in names.items() if f == field)
            raise InvalidPolicy(f"{named}={value!r}: expected {EXPECTED[field]}")
    try:
        return model.model_validate(values)
    except ValidationError as error:
        first = error.errors()[0]
        field = str(first["loc"][0]) if first["loc"] else ""
        annotation = next((PREFIX + n for n, f in names.items() if f == field), None)
        if annotation is None:  # a check across fields (max below min)
            raise InvalidPolicy(str(first["msg"]).removeprefix("Value error, ")) from None
        if first["type"] == "missing":
            raise InvalidPolicy(
                f"{annotation} is required for a {_role(model)} workload: "
                f"expected {EXPECTED[field]}"
            ) from None
        raise InvalidPolicy(
            f"{annotation}={values.get(field)!r}: expected {EXPECTED[field]}"
        ) from None


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
        serving = _policy(ServingPolicy, SERVING_ANNOTATIONS, annotations)
    else:
        training = _policy(TrainingPolicy, TRAINING_ANNOTATIONS, annotations)
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
        resource_version=workload.resource_version,
        observed_at=observed_at,
    )
