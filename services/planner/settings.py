"""`tideshift run planner`'s settings: its targets, its loop's timing, and every `PolicyConfig`
tunable under the policy's own name, with the policy's default, bounds and meaning. Decides
nothing; imports no service but the planner's pure modules."""

from __future__ import annotations

from dataclasses import fields
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from tideshift.events import PINS_BUCKET, RISE_HISTORY_BUCKET, SNAPSHOT_BUCKET
from tideshift.events.models import (
    DEFAULT_RESTART_COST_S,
    DEFAULT_SPEEDUP_EXPONENT,
    MAX_RESTART_COST_S,
)
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


class ServingTarget(BaseModel):
    """A serving workload the planner sizes from its forecast."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: str = "Deployment"
    namespace: str = Field(min_length=1)
    name: str = Field(min_length=1)
    cpu: float = Field(ge=0, description="per-replica cpu request, cores")
    memory: float = Field(0.0, ge=0, description="per-replica memory request, bytes")
    gpu: int = Field(0, ge=0)
    capacity_rps: float = Field(gt=0, description="req/s one replica serves at target utilisation")
    min_replicas: int = Field(1, ge=0)
    max_replicas: int = Field(1000, ge=1)
    lead_time_s: float = Field(60.0, ge=0, description="pod start-up until ready")
    margin_s: float = Field(60.0, ge=0)
    stabilization_s: float = Field(300.0, ge=0)
    quantile: float = Field(pol.DEFAULT_SERVING_QUANTILE, gt=0, lt=1)
    target_utilization: float = Field(
        1.0,
        gt=0,
        le=1,
        description="fraction of its cpu request a replica uses while serving capacity_rps; "
        "batch jobs may borrow the rest (1: nothing of a busy replica is lent)",
    )

    def workload(self) -> pol.ServingWorkload:
        return pol.ServingWorkload(
            target=pol.Target(self.namespace, self.kind, self.name),
            replica_requests=(self.cpu, self.memory, float(self.gpu)),
            capacity_rps=self.capacity_rps,
            min_replicas=self.min_replicas,
            max_replicas=self.max_replicas,
            lead_time_s=self.lead_time_s,
            margin_s=self.margin_s,
            stabilization_s=self.stabilization_s,
            quantile=self.quantile,
            target_utilization=self.target_utilization,
        )


class TrainingTarget(BaseModel):
    """An elastic training job the planner resizes within [min, max] trainers."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: str = "PyTorchJob"
    namespace: str = Field(min_length=1)
    name: str = Field(min_length=1)
    cpu: float = Field(ge=0, description="per-trainer cpu request, cores")
    memory: float = Field(0.0, ge=0)
    gpu: int = Field(0, ge=0)
    min_trainers: int = Field(1, ge=1)
    max_trainers: int = Field(ge=1)
    gang_min: int | None = Field(None, ge=1)
    priority: int = 0
    weight: float = Field(1.0, gt=0)
    companion_markers: tuple[str, ...] = DEFAULT_COMPANION_MARKERS
    restart_cost_s: float = Field(
        DEFAULT_RESTART_COST_S,
        ge=0,
        le=MAX_RESTART_COST_S,
        description="seconds without progress each time its trainers change (checkpoint, re-form)",
    )
    speedup_exponent: float = Field(
        DEFAULT_SPEEDUP_EXPONENT, gt=0, le=1, description="throughput grows as trainers ** this"
    )
    batch: bool = Field(
        False,
        description="trainers request tideshift.io/batch-cpu / batch-memory (cpu, memory: "
        "what one borrows) and run on serving's idle reservation, shrunk first",
    )

    @model_validator(mode="after")
    def _batch_borrows_no_gpu(self) -> TrainingTarget:
        if self.batch and self.gpu > 0:
            raise ValueError(f"{self.name}: batch: GPUs are not lent, expected gpu 0")
        return self

    @property
    def target(self) -> pol.Target:
        return pol.Target(self.namespace, self.kind, self.name)

    def job(self, submitted_at: float) -> pol.TrainingJob:
        return pol.TrainingJob(
            target=self.target,
            trainer_requests=(self.cpu, self.memory, float(self.gpu)),
            min_trainers=self.min_trainers,
            max_trainers=self.max_trainers,
            gang_min=self.gang_min,
            priority=self.priority,
            weight=self.weight,
            submitted_at=submitted_at,
            batch=self.batch,
            speedup_exponent=self.speedup_exponent,
            restart_cost_s=self.restart_cost_s,
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
    rise_quantile: float = _tunable("rise_quantile")
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
