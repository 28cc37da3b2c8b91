"""Every subject Tideshift publishes on, each bound to exactly one payload model.

Patterns name their variable tokens in braces; `Subject.at(...)` fills them with encoded
Kubernetes names, so no subject string is ever assembled anywhere else. A `BoundSubject[T]`
only accepts a `T` when published (checked by mypy and again at run time by the bus).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from tideshift.events.models import (
    DeadLetter,
    DemandObserved,
    EventData,
    ForecastIssued,
    KueueQuotaLent,
    NodeChanged,
    PlanDecided,
    PlannerStatus,
    PodChanged,
    ScaleCommand,
    ScaleResult,
    ServingNeed,
    WorkloadChanged,
)
from tideshift.events.tokens import decode_token, encode_token
from tideshift.events.training import JobProgress, ShardTask, TrainerMembership

T = TypeVar("T", bound=EventData)

ROOT = "tideshift.v1"
# The one JetStream stream that keeps both scale commands and scale results.
SCALE_STREAM_NAME = "TIDESHIFT_SCALE"
_PARAM = re.compile(r"^\{([a-z_]+)\}$")


@dataclass(frozen=True)
class SubjectPattern:
    """A subject pattern such as `tideshift.v1.cluster.pod.{namespace}.{name}`."""

    pattern: str
    description: str

    @property
    def tokens(self) -> tuple[str, ...]:
        return tuple(self.pattern.split("."))

    @property
    def params(self) -> tuple[str, ...]:
        return tuple(m.group(1) for t in self.tokens if (m := _PARAM.match(t)))

    def parse(self, subject: str) -> dict[str, str]:
        """Decode a concrete subject of this pattern back into its parameter values."""
        parts = subject.split(".")
        if len(parts) != len(self.tokens):
            raise ValueError(f"subject {subject!r} does not match {self.pattern}")
        values: dict[str, str] = {}
        for pattern_token, token in zip(self.tokens, parts, strict=True):
            if m := _PARAM.match(pattern_token):
                values[m.group(1)] = decode_token(token)
            elif pattern_token != token:
                raise ValueError(f"subject {subject!r} does not match {self.pattern}")
        return values

    def matches(self, subject: str) -> bool:
        try:
            self.parse(subject)
        except ValueError:
            return False
        return True

    def _concrete(self, values: dict[str, str]) -> str:
        missing = set(self.params) - set(values)
        unknown = set(values) - set(self.params)
        if missing or unknown:
            raise ValueError(
                f"{self.pattern}: missing {sorted(missing)}, unknown {sorted(unknown)}"
            )
        return self._fill(values, default=None)

    def _wildcard(self, values: dict[str, str]) -> str:
        unknown = set(values) - set(self.params)
        if unknown:
            raise ValueError(f"{self.pattern}: unknown parameters {sorted(unknown)}")
        return self._fill(values, default="*")

    def _fill(self, values: dict[str, str], *, default: str | None) -> str:
        out: list[str] = []
        for token in self.tokens:
            if m := _PARAM.match(token):
                name = m.group(1)
                out.append(encode_token(values[name]) if name in values else str(default))
            else:
                out.append(token)
        return ".".join(out)


@dataclass(frozen=True)
class RawSubject(SubjectPattern):
    """A subject of binary request/reply traffic that is not an event (no CloudEvent body)."""

    def at(self, **values: str) -> str:
        return self._concrete(values)

    def filter(self, **values: str) -> str:
        return self._wildcard(values)


@dataclass(frozen=True)
class Subject(SubjectPattern, Generic[T]):
    """An event subject pattern bound to the one model its messages carry."""

    model: type[T]
    # The JetStream stream that keeps these messages (acked, never lost); None = core NATS,
    # fire-and-forget telemetry that the next message supersedes.
    stream: str | None = None

    @property
    def durable(self) -> bool:
        return self.stream is not None

    def at(self, **values: str) -> BoundSubject[T]:
        """The concrete subject for these parameter values (all required)."""
        return BoundSubject(self, self._concrete(values))

    def filter(self, **values: str) -> BoundSubject[T]:
        """A wildcard subject: parameters not given match any single token."""
        return BoundSubject(self, self._wildcard(values))


@dataclass(frozen=True)
class BoundSubject(Generic[T]):
    """A concrete (or wildcard) subject string that carries payloads of one model."""

    subject: Subject[T]
    value: str

    @property
    def model(self) -> type[T]:
        return self.subject.model

    @property
    def is_wildcard(self) -> bool:
        return any(token in {"*", ">"} for token in self.value.split("."))

    @property
    def mqtt_topic(self) -> str:
        return mqtt_topic_filter(self.value)

    def __str__(self) -> str:
        return self.value


def mqtt_topic_filter(nats_subject: str) -> str:
    """The MQTT topic (filter) that the NATS MQTT listener maps onto a NATS subject."""
    mapping = {"*": "+", ">": "#"}
    return "/".join(mapping.get(token, token) for token in nats_subject.split("."))


NODE_CHANGED = Subject(
    f"{ROOT}.cluster.node.{{name}}",
    description="a node was added, changed or removed",
    model=NodeChanged,
)
POD_CHANGED = Subject(
    f"{ROOT}.cluster.pod.{{namespace}}.{{name}}",
    description="a pod changed phase, node or owner",
    model=PodChanged,
)
WORKLOAD_CHANGED = Subject(
    f"{ROOT}.cluster.workload.{{namespace}}.{{kind}}.{{name}}",
    description="a labelled scale target (tideshift.io/role) appeared, changed or was deleted",
    model=WorkloadChanged,
)
FORECAST = Subject(
    f"{ROOT}.forecast.{{namespace}}.{{workload}}",
    description="demand forecast for a serving workload",
    model=ForecastIssued,
)
DEMAND_OBSERVED = Subject(
    f"{ROOT}.demand.observed.{{namespace}}.{{workload}}",
    description="latest measured demand of a serving workload (the planner's safety net)",
    model=DemandObserved,
)
PLAN_DECIDED = Subject(
    f"{ROOT}.plan.decided.{{policy}}",
    description="the planner's decision with a reason per target",
    model=PlanDecided,
)
SERVING_NEED = Subject(
    f"{ROOT}.plan.serving_need.{{policy}}",
    description="serving's need over the lead time as a plan sized it (lent to Kueue)",
    model=ServingNeed,
)
KUEUE_QUOTA = Subject(
    f"{ROOT}.kueue.quota",
    description="the quota an executor lent to labelled Kueue ClusterQueues, and why",
    model=KueueQuotaLent,
)
PLANNER_STATUS = Subject(
    f"{ROOT}.planner.status.{{planner}}",
    description="leadership and degraded-mode changes of a planner",
    model=PlannerStatus,
)
SCALE_COMMAND = Subject(
    f"{ROOT}.scale.command.{{namespace}}.{{kind}}.{{name}}",
    description="desired scale of one target (JetStream, acked by an executor)",
    model=ScaleCommand,
    stream=SCALE_STREAM_NAME,
)
SCALE_RESULT = Subject(
    f"{ROOT}.scale.result.{{namespace}}.{{kind}}.{{name}}",
    description="what an executor did with a scale command",
    model=ScaleResult,
    stream=SCALE_STREAM_NAME,
)
SHARD_TASK = Subject(
    f"{ROOT}.training.task.{{job}}",
    description="one shard of one epoch for a job's trainers (JetStream work queue)",
    model=ShardTask,
    stream="TIDESHIFT_TRAINING_TASKS",
)
JOB_PROGRESS = Subject(
    f"{ROOT}.training.progress.{{job}}",
    description="epoch and shard progress of a training job",
    model=JobProgress,
)
TRAINER_MEMBERSHIP = Subject(
    f"{ROOT}.training.member.{{job}}.{{trainer}}",
    description="a trainer joined, left or crashed",
    model=TrainerMembership,
)
DEAD_LETTER = Subject(
    f"{ROOT}.deadletter.{{consumer}}",
    description="a message a subscriber rejected, with the reason",
    model=DeadLetter,
    stream="TIDESHIFT_DEADLETTER",
)
PSERVER_RPC = RawSubject(
    f"{ROOT}.training.pserver.{{job}}.{{index}}.{{op}}",
    description="binary parameter pulls and gradient pushes to parameter server `index`",
)

# Any: each element binds a different model; `Subject` is invariant to keep publish() typed.
ALL_SUBJECTS: tuple[Subject[Any], ...] = (
    NODE_CHANGED,
    POD_CHANGED,
    WORKLOAD_CHANGED,
    FORECAST,
    DEMAND_OBSERVED,
    PLAN_DECIDED,
    PLANNER_STATUS,
    SERVING_NEED,
    KUEUE_QUOTA,
    SCALE_COMMAND,
    SCALE_RESULT,
    SHARD_TASK,
    JOB_PROGRESS,
    TRAINER_MEMBERSHIP,
    DEAD_LETTER,
)
