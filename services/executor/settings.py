"""`tideshift run executor`'s settings: the cluster it writes to, how it takes commands, what
it may scale, what it advertises to batch trainers (the lending section is shared with the
planner: `LendingSettings`) and how long the decision history is kept. Decides nothing."""

from __future__ import annotations

import dataclasses
from typing import Literal

from pydantic import Field, field_validator, model_validator

from tideshift.events import EXECUTOR_RECORDS_BUCKET, WorkloadRef
from tideshift.services.cluster.core.kueue_quota import QuotaConfig
from tideshift.services.cluster.core.overcommit import OvercommitConfig
from tideshift.services.common.bus.streams import HISTORY_STREAM, StreamSpec
from tideshift.services.common.settings import LendingSettings
from tideshift.services.executor.core.decision import Admission
from tideshift.services.executor.core.fight import FightPolicy

# Non-batch usage per node (cAdvisor series relabelled with `node`); trainers that borrow
# batch resources run in the training namespace and are left out.
NON_BATCH_CPU_QUERY = (
    'sum by (node) (rate(container_cpu_usage_seconds_total{container!="",'
    'namespace!="tideshift-training"}[2m]))'
)
NON_BATCH_MEMORY_QUERY = (
    'sum by (node) (container_memory_working_set_bytes{container!="",'
    'namespace!="tideshift-training"})'
)


class ExecutorSettings(LendingSettings):
    """Apply scale commands to Kubernetes and publish what was done."""

    kubeconfig: str | None = Field(
        default=None,
        description="kubeconfig path; unset = $KUBECONFIG or ~/.kube/config, or in-cluster",
    )
    kube_context: str | None = Field(default=None, description="kubeconfig context to use")
    durable: str = Field(
        default="tideshift-executor",
        pattern=r"^[A-Za-z0-9_-]+$",
        description="durable consumer name shared by all executors",
    )
    mode: Literal["act", "observe"] = Field(
        default="act",
        description="observe: change no object; every command that would scale a target "
        "leaves a TideshiftWouldScale Event on it and a would_scale result",
    )
    dry_run: bool = Field(default=False, description="only publish what would be done")
    max_step: int = Field(
        default=0, ge=0, description="largest replica change per command; 0 = unlimited"
    )
    max_attempts: int = Field(
        default=5, ge=1, description="deliveries of a command before it is reported failed"
    )
    ack_wait_seconds: float = Field(
        default=30.0, gt=0, description="redeliver a command not acked within this time"
    )
    record_bucket: str = Field(
        default=EXECUTOR_RECORDS_BUCKET,
        pattern=r"^[A-Za-z0-9_-]+$",
        description="NATS KV bucket of per-target applied commands (idempotency)",
    )
    compaction: bool = Field(
        default=True,
        description="before lowering a Deployment, mark the pods whose removal frees whole "
        "nodes with pod-deletion-cost so they go first",
    )
    managed_only: bool = Field(
        default=True,
        description="act only on targets labelled tideshift.io/role (serving or training) "
        "or listed in managed_targets; reject commands for anything else",
    )
    managed_targets: list[str] = Field(
        default_factory=list,
        description="targets managed without the label, as Kind.group/namespace/name "
        "(e.g. Deployment.apps/shop/web)",
    )
    allowed_namespaces: list[str] = Field(
        default_factory=list,
        description="namespaces whose targets may be scaled; empty = every namespace",
    )
    batch_resources: bool = Field(
        default=False,
        description="advertise tideshift.io/batch-cpu and batch-memory on each Node's status: "
        "what non-batch pods request but do not use (usage from Prometheus), within "
        "allocatable - that usage - lend_margin",
    )
    prometheus_url: str | None = Field(
        default=None, description="Prometheus with per-node usage (needed by batch_resources)"
    )
    batch_interval_seconds: float = Field(
        default=30.0, gt=0, description="how often batch resources are re-advertised"
    )
    batch_cpu_query: str = Field(
        default=NON_BATCH_CPU_QUERY,
        description="PromQL: cpu cores used by non-batch pods, one series per `node` label",
    )
    batch_memory_query: str = Field(
        default=NON_BATCH_MEMORY_QUERY,
        description="PromQL: memory bytes used by non-batch pods, one series per `node` label",
    )
    history_max_age_hours: float = Field(
        default=HISTORY_STREAM.max_age_seconds / 3600,
        gt=0,
        le=24 * 366,
        description="how long plans, scale commands and results are kept for `tideshift "
        "explain` (the TIDESHIFT_HISTORY stream, which this service creates)",
    )
    history_max_bytes: int = Field(
        default=HISTORY_STREAM.max_bytes,
        ge=1024 * 1024,
        description="the decision history's size limit; the oldest go first",
    )
    history_max_messages: int = Field(
        default=HISTORY_STREAM.max_msgs, ge=1000, description="its message limit, likewise"
    )

    fight_detection: bool = Field(
        default=True,
        description="stop writing a target whose replicas another writer (kubectl, a GitOps "
        "controller, another autoscaler) keeps changing against the plan; a TideshiftFight "
        "Warning Event says so",
    )
    fight_max_overrides: int = Field(
        default=3,
        ge=1,
        description="changes by another writer, within fight_window_seconds, that make a fight",
    )
    fight_window_seconds: float = Field(
        default=600.0, gt=0, description="the window in which those changes are counted"
    )
    fight_quiet_seconds: float = Field(
        default=900.0,
        gt=0,
        description="a held target is written again once the other writer left it alone this "
        "long (or at once: `tideshift scale --resume`)",
    )

    other_autoscalers: bool = Field(
        default=True,
        description="before writing a target, look for an HPA or a KEDA ScaledObject on it: "
        "Tideshift then writes nothing (TideshiftLeftToAutoscaler Warning Event), or with "
        "tideshift.io/other-autoscaler: steer writes that autoscaler's min/max instead",
    )
    kueue_lending: bool = Field(
        default=False,
        description="set the nominalQuota of ClusterQueues labelled tideshift.io/lend-quota "
        "to what serving will not need within the lead time, from each plan's serving need "
        "(docs/guides/kueue.md); never in observe mode or a dry run",
    )
    kueue_quota_min_interval_seconds: float = Field(
        default=300.0,
        ge=0,
        le=86_400,
        description="a lent quota grows at most once per this many seconds (shrinking for "
        "serving is never held back)",
    )

    @field_validator("managed_targets")
    @classmethod
    def _target_refs(cls, values: list[str]) -> list[str]:
        for value in values:
            try:
                WorkloadRef.parse(value)
            except ValueError as error:
                raise ValueError(f"{value!r}: {error}") from None
        return values

    def history_stream(self) -> StreamSpec:
        return dataclasses.replace(
            HISTORY_STREAM,
            max_age_seconds=self.history_max_age_hours * 3600,
            max_bytes=self.history_max_bytes,
            max_msgs=self.history_max_messages,
        )

    def admission(self) -> Admission:
        return Admission(
            managed_only=self.managed_only,
            listed=frozenset(WorkloadRef.parse(value) for value in self.managed_targets),
            namespaces=frozenset(self.allowed_namespaces),
        )

    def fight_policy(self) -> FightPolicy:
        return FightPolicy(
            max_overrides=self.fight_max_overrides,
            window_s=self.fight_window_seconds,
            quiet_s=self.fight_quiet_seconds,
        )

    @model_validator(mode="after")
    def _prometheus_for_batch(self) -> ExecutorSettings:
        if self.batch_resources and not self.prometheus_url:
            raise ValueError("prometheus_url: required when batch_resources is on")
        return self

    def kueue_quota(self) -> QuotaConfig:
        return QuotaConfig(min_interval_s=self.kueue_quota_min_interval_seconds)

    def lending(self) -> OvercommitConfig:
        """What a node lends: the margin the planner plans with too."""
        return OvercommitConfig(margin=self.lend_margin)
