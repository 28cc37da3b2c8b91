"""Payload models of every Tideshift event.

Each model is frozen and rejects unknown fields. Its CloudEvents `type` carries its schema
version (`io.tideshift.scale.command.v1`): a breaking change adds a new version rather than
altering an old one. Quantities use base units: cpu in cores, memory in bytes, durations in
seconds (fields named `*_seconds`), demand in requests per second, instants in UTC.

`ServingPolicy` and `TrainingPolicy` are the one declaration of a workload's spec: every field,
its default, bounds and unit, and (as field metadata) the `tideshift.io/*` annotation it is read
from and what that annotation expects. The watcher's annotation parser, the planner's targets,
the simulator's scenarios and the demo's world all build their workloads from them.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from datetime import datetime
from typing import Annotated, Any, ClassVar, Literal

from pydantic import (
    AwareDatetime,
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidatorFunctionWrapHandler,
    field_validator,
    model_validator,
)
from pydantic.dataclasses import dataclass as pydantic_dataclass
from pydantic_core import PydanticUndefined

# A Kubernetes object name or namespace: non-empty, at most 253 characters.
KubeName = Annotated[str, Field(min_length=1, max_length=253)]
# A namespace is a DNS label: at most 63 characters.
Namespace = Annotated[str, Field(min_length=1, max_length=63)]

# Bounds of what the cluster can mean, so that every valid event can be planned.
MAX_REPLICAS = 2**31 - 1  # replicas are int32 in Kubernetes
# A training job's restart (checkpoint, re-form) longer than an hour is no elastic job.
MAX_RESTART_COST_S = 3600.0
Replicas = Annotated[int, Field(ge=0, le=MAX_REPLICAS)]
# Below this a replica's capacity is no capacity: demand / capacity would overflow a count.
MIN_CAPACITY_RPS = 1e-3
MAX_RPS = 1e12  # demand and forecasts in requests/s: more is a unit mistake, not traffic
MAX_SECONDS = 1e7  # lead times, windows and steps: about 115 days
Rps = Annotated[float, Field(ge=0, le=MAX_RPS)]

Change = Literal["added", "modified", "deleted"]
Role = Literal["serving", "training", "other"]


class _Frozen(BaseModel):
    # NaN and Infinity are never a quantity: rejected here rather than turned into garbage
    # by the integer arithmetic of a policy.
    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)


class EventData(_Frozen):
    """Base of every event payload; subclasses set `event_name` and `schema_version`."""

    event_name: ClassVar[str] = ""
    schema_version: ClassVar[int] = 1

    @classmethod
    def event_type(cls) -> str:
        return f"io.tideshift.{cls.event_name}.v{cls.schema_version}"


class Resources(_Frozen):
    """An amount of the resources the planner packs: cores, bytes and whole GPUs."""

    cpu: float = Field(default=0.0, ge=0, le=1e9, description="CPU cores")
    memory: float = Field(default=0.0, ge=0, le=2.0**63, description="memory in bytes")
    gpu: int = Field(default=0, ge=0, le=MAX_REPLICAS, description="nvidia.com/gpu devices")


# The API group of a kind named without one (kubectl's defaults); any other bare kind is in
# the core group. `Job` alone is batch/v1: a Volcano Job must be named `Job.batch.volcano.sh`.
DEFAULT_GROUPS: dict[str, str] = {
    "Deployment": "apps",
    "StatefulSet": "apps",
    "ReplicaSet": "apps",
    "DaemonSet": "apps",
    "Job": "batch",
    "CronJob": "batch",
    "PyTorchJob": "kubeflow.org",
}
_QUALIFIED_KIND = re.compile(r"[A-Z][A-Za-z0-9]*(?:\.[a-z0-9](?:[a-z0-9.-]*[a-z0-9])?)?")


@pydantic_dataclass(frozen=True, order=True, slots=True, config=ConfigDict(extra="forbid"))
class WorkloadRef:
    """A workload (scale target) by group-qualified kind, namespace and name; the one
    identity of the contract, the cluster port, the policy and the executor.

    `kind` is `Kind.group` (`Deployment.apps`, `Job.batch`, `Job.batch.volcano.sh`,
    `PyTorchJob.kubeflow.org`); a bare well-known kind is qualified with its default group on
    construction. Printed and parsed as `Kind.group/namespace/name`.
    """

    namespace: Namespace
    kind: Annotated[str, Field(max_length=253, description="Kind.group: Job.batch.volcano.sh")]
    name: KubeName

    @field_validator("kind")
    @classmethod
    def _qualified(cls, kind: str) -> str:
        if not _QUALIFIED_KIND.fullmatch(kind):
            raise ValueError(f"expected Kind.group (e.g. Deployment.apps), got {kind!r}")
        if "." not in kind and kind in DEFAULT_GROUPS:
            return f"{kind}.{DEFAULT_GROUPS[kind]}"
        return kind

    @property
    def group(self) -> str:
        """The API group (`apps`, `batch.volcano.sh`); `` for the core group."""
        return self.kind.partition(".")[2]

    @property
    def plain_kind(self) -> str:
        """The kind as in `metadata`/`ownerReferences` (`Job`), without its group."""
        return self.kind.partition(".")[0]

    @classmethod
    def parse(cls, text: str) -> WorkloadRef:
        """`Kind.group/namespace/name` -> WorkloadRef; ValueError naming what was expected."""
        parts = text.split("/")
        if len(parts) != 3:
            raise ValueError(f"expected Kind.group/namespace/name, got {text!r}")
        return cls(namespace=parts[1], kind=parts[0], name=parts[2])

    def __str__(self) -> str:
        return f"{self.kind}/{self.namespace}/{self.name}"


class NodeChanged(EventData):
    event_name: ClassVar[str] = "cluster.node.changed"

    change: Change
    name: KubeName
    allocatable: Resources
    labels: dict[str, str] = Field(default_factory=dict)
    ready: bool = True
    unschedulable: bool = False
    resource_version: str = ""
    observed_at: AwareDatetime


class PodChanged(EventData):
    event_name: ClassVar[str] = "cluster.pod.changed"

    change: Change
    namespace: Namespace
    name: KubeName
    uid: str = ""
    phase: Literal["Pending", "Running", "Succeeded", "Failed", "Unknown"]
    node: str | None = None
    priority: int = 0
    priority_class: str | None = None
    owner: WorkloadRef | None = Field(default=None, description="the scale target owning the pod")
    role: Role = "other"
    companion: bool = Field(
        default=False,
        description="a fixed helper of a training job (parameter server), not a trainer",
    )
    requests: Resources = Resources()
    deleting: bool = Field(default=False, description="deletionTimestamp is set")
    resource_version: str = ""
    observed_at: AwareDatetime


ANNOTATION_PREFIX = "tideshift.io/"
# A training job's work model unless it says otherwise (tideshift.io/restart-cost-seconds and
# speedup-exponent): seconds lost per change of its trainers, throughput as trainers ** this.
DEFAULT_RESTART_COST_S = 30.0
DEFAULT_SPEEDUP_EXPONENT = 0.8


def annotated(name: str, expected: str, default: Any = PydanticUndefined, **field: Any) -> Any:
    """A spec field read from the annotation `tideshift.io/<name>`; `expected` says in words
    what its value must be (the parser's error message). Other arguments as `Field`'s."""
    return Field(
        default,
        json_schema_extra={"annotation": ANNOTATION_PREFIX + name, "expected": expected},
        **field,
    )


def annotation_fields(model: type[BaseModel]) -> dict[str, tuple[str, str]]:
    """A spec's annotations: `tideshift.io/<name>` -> (field name, what it expects)."""
    found = {}
    for name, info in model.model_fields.items():
        extra = info.json_schema_extra
        if isinstance(extra, dict) and isinstance(extra.get("annotation"), str):
            found[str(extra["annotation"])] = (name, str(extra.get("expected", "")))
    return found


def annotation_of(model: type[BaseModel], name: str) -> str:
    """The annotation a spec's field is read from (`tideshift.io/min-replicas`)."""
    return next(key for key, (field, _) in annotation_fields(model).items() if field == name)


def spec_default(model: type[BaseModel], name: str) -> Any:
    """The default of a spec's field: what a workload without its annotation gets."""
    return model.model_fields[name].get_default(call_default_factory=True)


class ServingPolicy(_Frozen):
    """How to size a serving workload (the serving workload spec), from its `tideshift.io/*`
    annotations. Seconds and requests/s."""

    capacity_rps: float = annotated(
        "capacity-rps",
        "a number of requests/s > 0",
        ge=MIN_CAPACITY_RPS,
        le=MAX_RPS,
        description="requests/s one replica serves at its target utilisation",
    )
    min_replicas: int = annotated("min-replicas", "a whole number >= 0", 1, ge=0, le=MAX_REPLICAS)
    max_replicas: int = annotated(
        "max-replicas",
        "a whole number >= 1, not below min-replicas",
        1000,
        ge=1,
        le=MAX_REPLICAS,
    )
    lead_time_seconds: float = annotated(
        "lead-time-seconds",
        "seconds >= 0",
        60.0,
        ge=0,
        le=MAX_SECONDS,
        description="pod start-up until ready",
    )
    margin_seconds: float = annotated(
        "margin-seconds",
        "seconds >= 0",
        60.0,
        ge=0,
        le=MAX_SECONDS,
        description="extra look-ahead beyond the lead time",
    )
    quantile: float = annotated(
        "quantile",
        "a number between 0 and 1, e.g. 0.95",
        0.95,
        gt=0,
        lt=1,
        description="forecast quantile read for what serving may take back from lent room "
        "(batch room, GPU loans, growth payback); serving's own size is priced "
        "(shortfall-price)",
    )
    # The one price serving's size is decided by (planner/core/serving/price.py): replicas are
    # added while the chance they are needed is worth more than the training they displace.
    shortfall_price: float = annotated(
        "shortfall-price",
        "core-hours > 0, e.g. 10",
        10.0,
        gt=0,
        le=1e9,
        description="core-hours of training worth giving up to keep one replica's worth of "
        "demand (capacity-rps) from going unserved for a minute; sizes serving at the demand "
        "level 1 - replica cpu / (60 x price)",
    )
    stabilization_seconds: float = annotated(
        "stabilization-seconds",
        "seconds >= 0",
        300.0,
        ge=0,
        le=MAX_SECONDS,
        description="scale-down waits for the window's highest need",
    )
    # 1 by default: nothing of a busy replica is lent unless its owner says how much of its
    # request a replica uses at capacity_rps.
    target_utilization: float = annotated(
        "target-utilization",
        "a fraction > 0 and <= 1, e.g. 0.8",
        1.0,
        gt=0,
        le=1,
        description="fraction of its cpu request a replica uses while serving capacity_rps; "
        "batch jobs may borrow the rest (1: nothing of a busy replica is lent)",
    )
    demand_query: str = annotated(
        "demand-query",
        "a PromQL expression",
        "",
        description="PromQL of its demand; empty: default",
    )
    other_autoscaler: Literal["yield", "steer"] = annotated(
        "other-autoscaler",
        '"yield" or "steer"',
        "yield",
        description="when an HPA or a KEDA ScaledObject targets it: yield (Tideshift writes "
        "nothing to it) or steer (Tideshift writes the autoscaler's min/max from the forecast "
        "and leaves replicas to it)",
    )

    @model_validator(mode="after")
    def _bounds_ordered(self) -> ServingPolicy:
        if self.max_replicas < self.min_replicas:
            raise ValueError(_bounds_message(self.min_replicas, self.max_replicas))
        return self


def _bounds_message(min_replicas: int, max_replicas: int) -> str:
    # Both values: an annotation out of order is fixed by seeing which one is wrong.
    return (
        f"min-replicas {min_replicas} above max-replicas {max_replicas} "
        "(max-replicas must be >= min-replicas)"
    )


class TrainingPolicy(_Frozen):
    """How to share capacity with a training job (the training workload spec), from its
    `tideshift.io/*` annotations. Seconds."""

    min_replicas: int = annotated(
        "min-replicas",
        "a whole number >= 1",
        1,
        ge=1,
        le=MAX_REPLICAS,
        description="fewest trainers",
    )
    max_replicas: int | None = annotated(
        "max-replicas",
        "a whole number >= 1, not below min-replicas",
        None,
        ge=1,
        le=MAX_REPLICAS,
        description="most; None: its own",
    )
    gang_min: int | None = annotated(
        "gang-min",
        "a whole number >= 1",
        None,
        ge=1,
        le=MAX_REPLICAS,
        description="trainers that must run at once",
    )
    priority: int = annotated("priority", "a whole number", 0, ge=-(2**31), le=2**31 - 1)
    weight: float = annotated("weight", "a number > 0", 1.0, ge=1e-6, le=1e6)
    scale_task: str = annotated(
        "scale-task",
        "the name of one of the job's tasks",
        "",
        description="Volcano: the task to scale",
    )
    batch: bool = annotated(
        "batch",
        '"true" or "false"',
        False,
        description="tideshift.io/batch: trainers borrow tideshift.io/batch-cpu / batch-memory "
        "(serving's idle reservation) and are the first to shrink",
    )
    # The job's work model, what the planner weighs a change of its trainers with; None: the
    # defaults above (DEFAULT_RESTART_COST_S, DEFAULT_SPEEDUP_EXPONENT).
    restart_cost_seconds: float | None = annotated(
        "restart-cost-seconds",
        f"seconds >= 0 and <= {MAX_RESTART_COST_S:.0f}",
        None,
        ge=0,
        le=MAX_RESTART_COST_S,
        description="seconds without progress each time its trainers change (checkpoint, "
        f"re-form); None: {DEFAULT_RESTART_COST_S:g}",
    )
    speedup_exponent: float | None = annotated(
        "speedup-exponent",
        "a number > 0 and <= 1, e.g. 0.8",
        None,
        gt=0,
        le=1,
        description=f"its throughput grows as trainers ** this; None: {DEFAULT_SPEEDUP_EXPONENT:g}",
    )

    @property
    def work_model(self) -> tuple[float, float]:
        """(restart cost seconds, speedup exponent), the defaults where it says nothing."""
        restart, exponent = self.restart_cost_seconds, self.speedup_exponent
        return (
            DEFAULT_RESTART_COST_S if restart is None else restart,
            DEFAULT_SPEEDUP_EXPONENT if exponent is None else exponent,
        )

    @model_validator(mode="after")
    def _bounds_ordered(self) -> TrainingPolicy:
        if self.max_replicas is not None and self.max_replicas < self.min_replicas:
            raise ValueError(_bounds_message(self.min_replicas, self.max_replicas))
        return self


class WorkloadChanged(EventData):
    """A labelled scale target (`tideshift.io/role`) appeared, changed or was deleted."""

    event_name: ClassVar[str] = "cluster.workload.changed"

    change: Change
    workload: WorkloadRef
    role: Literal["serving", "training"]
    replicas: Replicas = Field(description="desired replicas in its spec (Volcano: its task's)")
    ready_replicas: Replicas = 0
    min_replicas: Replicas = Field(default=0, description="its own lower bound (gang, elastic)")
    max_replicas: Replicas | None = Field(default=None, description="its own upper bound")
    requests: Resources = Field(
        description="per replica, from the pod template (a batch job's: what it borrows, "
        "its tideshift.io/batch-cpu and batch-memory)"
    )
    serving: ServingPolicy | None = None
    training: TrainingPolicy | None = None
    paused: bool = Field(default=False, description="tideshift.io/paused: leave it alone")
    held_by: str = Field(
        default="",
        max_length=500,
        description="why another engine keeps its size (e.g. Kueue, for an admitted job "
        "without workload slices): planned around, held where it is; empty when ours",
    )
    resource_version: str = ""
    observed_at: AwareDatetime

    @model_validator(mode="after")
    def _policy_of_its_role(self) -> WorkloadChanged:
        policy = self.serving if self.role == "serving" else self.training
        if policy is None:
            raise ValueError(f"a {self.role} workload carries its {self.role} policy")
        if self.training is not None and self.training.batch and self.requests.gpu > 0:
            raise ValueError("a batch job's trainers request no gpu: GPUs are not lent")
        return self


class ScalePin(_Frozen):
    """An operator's override (`tideshift scale --for`), kept in the KV bucket `PINS_BUCKET`
    (`events/buckets.py`) under the target's encoded identity: the planner leaves the target at
    `replicas` (capacity no other target may use) until `until` (None: until
    `tideshift scale --release`)."""

    target: WorkloadRef
    replicas: Replicas
    until: AwareDatetime | None = None
    reason: str = Field(default="manual override", max_length=500)
    pinned_at: AwareDatetime


# The forecast's quantile grid: the levels each forecast point carries (q50, q90, q95, q99).
QUANTILE_LEVELS: tuple[float, ...] = (0.5, 0.9, 0.95, 0.99)


class ForecastPoint(_Frozen):
    """Forecast demand (requests per second) for the step starting at `at`."""

    at: AwareDatetime
    point: Rps
    q50: Rps
    q90: Rps
    q95: Rps
    q99: Rps

    @model_validator(mode="after")
    def _quantiles_ordered(self) -> ForecastPoint:
        if not self.q50 <= self.q90 <= self.q95 <= self.q99:
            raise ValueError("quantiles must satisfy q50 <= q90 <= q95 <= q99")
        return self

    @staticmethod
    def field_of(level: float) -> str:
        """The field carrying a level of the grid: 0.95 -> `q95`."""
        return f"q{round(level * 100)}"

    def quantiles(self) -> dict[float, float]:
        """Its value at each level of QUANTILE_LEVELS."""
        return {level: getattr(self, self.field_of(level)) for level in QUANTILE_LEVELS}

    @classmethod
    def of(cls, at: datetime, point: float, quantiles: Mapping[float, float]) -> ForecastPoint:
        """A point from its value at each level of QUANTILE_LEVELS."""
        return cls.model_validate(
            {"at": at, "point": point}
            | {cls.field_of(level): quantiles[level] for level in QUANTILE_LEVELS}
        )


class ForecastIssued(EventData):
    event_name: ClassVar[str] = "forecast.issued"

    workload: WorkloadRef
    metric: str = Field(default="requests_per_second", min_length=1)
    issued_at: AwareDatetime
    step_seconds: float = Field(ge=1e-3, le=MAX_SECONDS)
    model: str = Field(min_length=1)
    points: tuple[ForecastPoint, ...] = Field(min_length=1)
    stale: bool = Field(default=False, description="re-issued from the last good fit")
    stale_reason: str = ""
    coverage: float | None = Field(
        default=None,
        ge=0,
        le=1,
        description="share of the workload's recent steps whose demand stayed within q0.95 "
        "as first forecast; None until enough steps were scored",
    )
    untrusted_reason: str = Field(
        default="",
        max_length=500,
        description="why recent forecasts are not to be trusted (coverage too low): the "
        "planner sizes on observed demand instead; empty while trusted",
    )


class DemandObserved(EventData):
    """A serving workload's latest measured demand: the input of the planner's safety net."""

    event_name: ClassVar[str] = "demand.observed"

    workload: WorkloadRef
    metric: str = Field(default="requests_per_second", min_length=1)
    rps: Rps = Field(description="requests per second (finite, non-negative)")
    observed_at: AwareDatetime


class ScaleCommand(EventData):
    event_name: ClassVar[str] = "scale.command"

    target: WorkloadRef
    desired: Replicas
    reason: str = Field(min_length=1, max_length=2000)
    plan_id: str = Field(min_length=1, max_length=128)
    issued_at: AwareDatetime
    idempotency_key: str = Field(min_length=1, max_length=256)
    issuer: str = Field(default="planner", description="planner, operator, ...")


class ScaleResult(EventData):
    event_name: ClassVar[str] = "scale.result"

    target: WorkloadRef
    idempotency_key: str = Field(min_length=1, max_length=256)
    # would_scale: observe mode (the executor's `mode: observe`) changed nothing; `current` is
    # what it would have set.
    outcome: Literal["applied", "noop", "rejected", "failed", "would_scale"]
    previous: Replicas | None = None
    current: Replicas | None = None
    desired: Replicas
    message: str = ""
    dry_run: bool = False
    executed_at: AwareDatetime
    executor: str = ""


class Headroom(_Frozen):
    """What sized a serving workload, in requests/s: replicas = the largest of the three
    over capacity_rps per replica, within its bounds. Read from the policy's own object's
    attributes when a plan is published."""

    model_config = ConfigDict(
        frozen=True, extra="forbid", allow_inf_nan=False, from_attributes=True
    )

    forecast: Rps = Field(description="the forecast quantile's peak over the look-ahead")
    rise: Rps = Field(description="observed x rise_ratio: where demand may be a lead time on")
    rise_ratio: float = Field(ge=0, le=MAX_RPS, description="the calibrated rise (>= 1)")
    observed: Rps = Field(description="demand observed now (0 when none)")
    panic_hold: bool = Field(description="scale-down held: demand ran above the forecast")
    recurring_period_s: float = Field(
        default=0.0,
        ge=0,
        le=MAX_SECONDS,
        description="a rise recurring with this period (seconds) is due and set rise_ratio; "
        "0: none",
    )


class TargetDecision(_Frozen):
    """One target's part of a plan: where it is, where it should go, and why."""

    target: WorkloadRef
    current: Replicas
    desired: Replicas
    reason: str
    skipped: bool = Field(
        default=False,
        description="the policy could not plan it: it keeps its last decision (reason says why)",
    )
    headroom: Headroom | None = Field(
        default=None, description="serving sized on a forecast: what sized it"
    )

    @field_validator("headroom", mode="wrap")
    @classmethod
    def _headroom_or_none(
        cls, value: object, handler: ValidatorFunctionWrapHandler
    ) -> Headroom | None:
        # Parts beyond the contract's range (a rise past 1e12 req/s) are left out rather
        # than costing the whole plan its publication.
        try:
            result: Headroom | None = handler(value)
        except ValidationError:
            return None
        return result


class PlanDecided(EventData):
    event_name: ClassVar[str] = "plan.decided"

    plan_id: str = Field(min_length=1)
    policy: str
    decided_at: AwareDatetime
    targets: tuple[TargetDecision, ...] = ()
    infeasible: tuple[str, ...] = ()


class ServingNeed(EventData):
    """Serving's need over the lead time as one plan sized it, and what else the plan places:
    published beside each `PlanDecided` for whatever lends the rest (the executor's quota
    lent to Kueue, docs/guides/kueue.md). Resources summed over the schedulable nodes."""

    event_name: ClassVar[str] = "plan.serving_need"

    plan_id: str = Field(min_length=1)
    policy: str
    decided_at: AwareDatetime
    capacity: Resources = Field(description="allocatable of the schedulable nodes")
    reserved: Resources = Field(
        description="serving's reservation over the lead time: the plan's serving sizes "
        "(at least what runs now) times each replica's requests"
    )
    expected: Resources = Field(
        description="what serving must have within the lead time: the median forecast's "
        "peak over it in replicas (at least what runs now) times each replica's requests"
    )
    other: Resources = Field(
        description="what else the plan places: Tideshift's training and the pods of no "
        "target (a Kueue-admitted job's pods among them)"
    )


class KueueQuotaStep(_Frozen):
    """What the executor did to one labelled ClusterQueue's quota, and why."""

    queue: str = Field(description="the ClusterQueue; empty when Kueue itself is unreadable")
    cpu: float | None = Field(default=None, ge=0, le=1e9, description="cpu quota now (cores)")
    memory: float | None = Field(default=None, ge=0, le=2.0**63, description="bytes")
    gpu: float | None = Field(default=None, ge=0, le=MAX_REPLICAS, description="devices")
    changed: bool = False
    reason: str
    error: bool = Field(default=False, description="bad input: the quota was not lent")
    deactivated: tuple[str, ...] = Field(default=(), description="namespace/name evicted")
    reactivated: tuple[str, ...] = Field(default=(), description="namespace/name let back")


class KueueQuotaLent(EventData):
    """The executor's quota lent to Kueue for one plan's `ServingNeed`: each labelled
    ClusterQueue's quota and why, bad input (a queue that cannot be lent) among them."""

    event_name: ClassVar[str] = "kueue.quota"

    plan_id: str = Field(min_length=1)
    executor: str = ""
    at: AwareDatetime
    queues: tuple[KueueQuotaStep, ...] = ()


class PlannerStatus(EventData):
    event_name: ClassVar[str] = "planner.status"

    planner: str
    leader: bool
    mode: Literal["normal", "degraded", "passive"]
    reasons: tuple[str, ...] = ()
    at: AwareDatetime


class DeadLetter(EventData):
    """A message a subscriber refused, with why, so nothing is silently lost."""

    event_name: ClassVar[str] = "deadletter"

    consumer: str
    original_subject: str
    reason: str
    payload: str = Field(
        description="the raw payload, decoded as UTF-8 with replacement, truncated"
    )
    payload_bytes: int = Field(ge=0)
    received_at: AwareDatetime
