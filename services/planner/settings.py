"""`tideshift run planner`'s settings: its targets, its loop's timing, and every `PolicyConfig`
tunable under the policy's own name, with the policy's default, bounds and meaning. Decides
nothing; imports no service but the planner's pure modules."""

from __future__ import annotations

from dataclasses import fields
from typing import Any, TypeVar

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator
from pydantic_core import PydanticUndefined

from tideshift.events import PINS_BUCKET, RISE_HISTORY_BUCKET, SNAPSHOT_BUCKET
from tideshift.events.models import ServingPolicy, TrainingPolicy
from tideshift.services.cluster.core.overcommit import OvercommitConfig
from tideshift.services.common.settings import LendingSettings
from tideshift.services.planner import core as pol
from tideshift.services.planner.core.baselines import POLICIES
from tideshift.services.planner.core.state import DEFAULT_COMPANION_MARKERS, StateConfig

_POLICY_FIELDS = {spec.name: spec for spec in fields(pol.PolicyConfig)}
# PolicyConfig's nested config: its margin is the lending section's `lend_margin`, the one the
# executor advertises with (`LendingSettings`).
_NESTED = "overcommit"


def _tunable(name: str) -> Any:
    """The setting of a `PolicyConfig` tunable: the policy's default, bounds and meaning."""
    spec = _POLICY_FIELDS[name]
    return Field(
        default=spec.default, description=spec.metadata["meaning"], **spec.metadata["bounds"]
    )


_Spec = TypeVar("_Spec", bound=BaseModel)
# Each target field that is a workload spec's -> that spec field (the settings keep their own
# names, `_s` for seconds and trainers for replicas).
SERVING_SPEC_NAMES = {
    "capacity_rps": "capacity_rps",
    "min_replicas": "min_replicas",
    "max_replicas": "max_replicas",
    "lead_time_s": "lead_time_seconds",
    "margin_s": "margin_seconds",
    "stabilization_s": "stabilization_seconds",
    "quantile": "quantile",
    "target_utilization": "target_utilization",
}
TRAINING_SPEC_NAMES = {
    "min_trainers": "min_replicas",
    "max_trainers": "max_replicas",
    "gang_min": "gang_min",
    "priority": "priority",
    "weight": "weight",
    "restart_cost_s": "restart_cost_seconds",
    "speedup_exponent": "speedup_exponent",
    "batch": "batch",
}


def _from_spec(spec: type[BaseModel], name: str, **override: Any) -> Any:
    """A target's field as the workload spec's field `name`: its default, bounds and meaning
    (a target names some fields its own way; `override` changes what the target needs
    otherwise, e.g. a default)."""
    info = spec.model_fields[name]
    bounds = {
        key: getattr(constraint, key)
        for constraint in info.metadata
        for key in ("gt", "ge", "lt", "le")
        if hasattr(constraint, key)
    }
    return Field(**{"default": info.default, "description": info.description, **bounds, **override})


def _serving(field: str, **override: Any) -> Any:
    return _from_spec(ServingPolicy, SERVING_SPEC_NAMES[field], **override)


def _training(field: str, **override: Any) -> Any:
    return _from_spec(TrainingPolicy, TRAINING_SPEC_NAMES[field], **override)


def _spec_of(spec: type[_Spec], target: BaseModel, names: dict[str, str]) -> _Spec:
    """The spec a target's fields describe (`names`: target field -> spec field)."""
    return spec.model_validate({names[field]: getattr(target, field) for field in names})


class ServingTarget(BaseModel):
    """A serving workload the planner sizes from its forecast: the serving workload spec
    (`ServingPolicy`: its defaults, bounds and meaning) under the settings' names."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: str = "Deployment"
    namespace: str = Field(min_length=1)
    name: str = Field(min_length=1)
    cpu: float = Field(ge=0, description="per-replica cpu request, cores")
    memory: float = Field(0.0, ge=0, description="per-replica memory request, bytes")
    gpu: int = Field(0, ge=0)
    capacity_rps: float = _serving("capacity_rps")
    min_replicas: int = _serving("min_replicas")
    max_replicas: int = _serving("max_replicas")
    lead_time_s: float = _serving("lead_time_s")
    margin_s: float = _serving("margin_s")
    stabilization_s: float = _serving("stabilization_s")
    quantile: float = _serving("quantile")
    target_utilization: float = _serving("target_utilization")

    @model_validator(mode="after")
    def _a_valid_spec(self) -> ServingTarget:
        self.spec()  # the spec's own checks (bounds in order)
        return self

    def spec(self) -> ServingPolicy:
        return _spec_of(ServingPolicy, self, SERVING_SPEC_NAMES)

    @classmethod
    def of(cls, spec: ServingPolicy, **target: Any) -> ServingTarget:
        """The target a spec describes; `target`: its identity and requests."""
        fields = {field: getattr(spec, name) for field, name in SERVING_SPEC_NAMES.items()}
        return cls(**target, **fields)

    def workload(self) -> pol.ServingWorkload:
        return pol.ServingWorkload.of(
            pol.Target(self.namespace, self.kind, self.name),
            (self.cpu, self.memory, float(self.gpu)),
            self.spec(),
        )


class TrainingTarget(BaseModel):
    """An elastic training job the planner resizes within [min, max] trainers: the training
    workload spec (`TrainingPolicy`: its defaults, bounds and meaning) under the settings'
    names."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: str = "PyTorchJob"
    namespace: str = Field(min_length=1)
    name: str = Field(min_length=1)
    cpu: float = Field(ge=0, description="per-trainer cpu request, cores")
    memory: float = Field(0.0, ge=0)
    gpu: int = Field(0, ge=0)
    min_trainers: int = _training("min_trainers")
    # Required here: a job listed in the settings has no bound of its own to fall back on.
    max_trainers: int = _training(
        "max_trainers", default=PydanticUndefined, description="most trainers"
    )
    gang_min: int | None = _training("gang_min")
    priority: int = _training("priority")
    weight: float = _training("weight")
    companion_markers: tuple[str, ...] = DEFAULT_COMPANION_MARKERS
    restart_cost_s: float | None = _training("restart_cost_s")
    speedup_exponent: float | None = _training("speedup_exponent")
    batch: bool = _training("batch")

    @model_validator(mode="after")
    def _a_valid_spec(self) -> TrainingTarget:
        self.spec()  # the spec's own checks (bounds in order)
        if self.batch and self.gpu > 0:
            raise ValueError(f"{self.name}: batch: GPUs are not lent, expected gpu 0")
        return self

    def spec(self) -> TrainingPolicy:
        return _spec_of(TrainingPolicy, self, TRAINING_SPEC_NAMES)

    @property
    def target(self) -> pol.Target:
        return pol.Target(self.namespace, self.kind, self.name)

    def job(self, submitted_at: float) -> pol.TrainingJob:
        return pol.TrainingJob.of(
            self.target,
            (self.cpu, self.memory, float(self.gpu)),
            self.spec(),
            min_trainers=self.min_trainers,
            max_trainers=self.max_trainers,
            submitted_at=submitted_at,
        )


class PlannerSettings(LendingSettings):
    """Plan serving and training scale from cluster events and forecasts; publish commands."""

    policy: str = Field(default="tideshift", description=f"one of {', '.join(POLICIES)}")

    @field_validator("policy")
    @classmethod
    def _known_policy(cls, value: str) -> str:
        if value not in POLICIES:
            raise ValueError(f"{value!r}: expected one of {', '.join(POLICIES)}")
        return value

    serving: list[ServingTarget] = Field(
        default_factory=list,
        description="serving workloads besides those labelled tideshift.io/role (these win)",
    )
    training: list[TrainingTarget] = Field(
        default_factory=list,
        description="elastic jobs besides those labelled tideshift.io/role (these win)",
    )
    tick_seconds: float = Field(default=15.0, gt=0, description="plan at least this often")
    debounce_seconds: float = Field(
        default=0.0,
        ge=0,
        description="least time between change-triggered plans; 0: plan as soon as one ends",
    )
    cluster_coalesce_seconds: float = Field(
        default=1.0,
        ge=0,
        description="node/pod churn alone plans at most this often (forecasts, demand and "
        "workload changes plan as soon as the plan in flight ends)",
    )
    max_announced_workloads: int = Field(
        # A plan over every announced workload runs on the event loop's thread in part: at
        # 77,000 (a flood) the loop stalled long enough for every NATS request to time out.
        default=5_000,
        ge=1,
        le=100_000,
        description="at most this many announced workloads are planned at once; further "
        "announcements are counted and skipped until one is removed",
    )
    subscription_buffer: int = Field(
        default=65_536,
        ge=1024,
        le=1_048_576,
        description="events each subscription holds while the planner catches up; beyond "
        "it NATS drops them and the snapshot resync repairs the view",
    )
    pins_bucket: str = Field(default=PINS_BUCKET, pattern=r"^[A-Za-z0-9_-]+$")
    lease_name: str = Field(default="planner", pattern=r"^[A-Za-z0-9_-]+$")
    lease_ttl_seconds: float = Field(default=15.0, gt=0, description="leadership lease TTL")
    observed_max_age_seconds: float = Field(
        default=30.0,
        gt=0,
        description="older observed demand is ignored (the predictor sends it every 10 s)",
    )
    cluster_silence_seconds: float = Field(
        default=900.0, gt=0, description="no node/pod event this long: cluster view stale"
    )
    resend_seconds: float = Field(
        default=120.0, gt=0, description="re-issue a command not confirmed after this long"
    )
    snapshot_bucket: str = Field(default=SNAPSHOT_BUCKET, pattern=r"^[A-Za-z0-9_-]+$")
    rise_history_bucket: str = Field(
        default=RISE_HISTORY_BUCKET,
        pattern=r"^[A-Za-z0-9_-]*$",
        description="KV bucket keeping serving's rise history across restarts "
        "(empty: keep none, learn again after every start)",
    )
    # The policy's tunables (PolicyConfig), each under its own name; a test checks none is
    # missing.
    max_forecast_age_s: float = _tunable("max_forecast_age_s")
    max_trainer_removals_per_step: int = _tunable("max_trainer_removals_per_step")
    min_trainer_lifetime_s: float = _tunable("min_trainer_lifetime_s")
    shrink_tolerance: float = _tunable("shrink_tolerance")
    grow_tolerance: float = _tunable("grow_tolerance")
    rebalance_floor: float = _tunable("rebalance_floor")
    panic_window_s: float = _tunable("panic_window_s")
    miss_tolerance: float = _tunable("miss_tolerance")
    rise_window_s: float = _tunable("rise_window_s")
    release_horizon_s: float = _tunable("release_horizon_s")
    batch_grow_after_s: float = _tunable("batch_grow_after_s")

    def policy_config(self) -> pol.PolicyConfig:
        """The policy's tunables as set."""
        values = {name: getattr(self, name) for name in _POLICY_FIELDS if name != _NESTED}
        return pol.PolicyConfig(**values, overcommit=OvercommitConfig(margin=self.lend_margin))

    def state_config(self) -> StateConfig:
        """What the planner's event-folding state takes from these settings."""
        return StateConfig(
            serving=tuple(target.workload() for target in self.serving),
            # Static jobs are admitted in the order the settings list them.
            jobs=tuple(target.job(float(index)) for index, target in enumerate(self.training)),
            companion_markers={job.target: job.companion_markers for job in self.training},
            policy=self.policy_config(),
            observed_max_age_s=self.observed_max_age_seconds,
            cluster_silence_s=self.cluster_silence_seconds,
            max_announced=self.max_announced_workloads,
        )
