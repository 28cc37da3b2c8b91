"""Every subject Tideshift publishes on, each bound to exactly one payload model.

Patterns name their variable tokens in braces; `Subject.at(...)` fills them with encoded
Kubernetes names, so no subject string is ever assembled anywhere else. A `BoundSubject[T]`
only accepts a `T` when published (checked by mypy and again at run time by the bus).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from events.models import (
    DeadLetter,
    EventData,
    ForecastIssued,
    JobProgress,
    NodeChanged,
    PlanDecided,
    PlannerStatus,
    PodChanged,
    ScaleCommand,
    ScaleResult,
    ShardTask,
    TrainerMembership,
)
from events.tokens import decode_token, encode_token

T = TypeVar("T", bound=EventData)

ROOT = "tideshift.v1"
_PARAM = re.compile(r"^\{([a-z_]+)\}$")


@dataclass(frozen=True)
class Subject(Generic[T]):
    """A subject pattern such as `tideshift.v1.cluster.pod.{namespace}.{name}` and its model."""

    pattern: str
    model: type[T]
    description: str
    durable: bool = False  # carried by JetStream with acks, not fire-and-forget core NATS

    @property
    def tokens(self) -> tuple[str, ...]:
        return tuple(self.pattern.split("."))

    @property
    def params(self) -> tuple[str, ...]:
        return tuple(m.group(1) for t in self.tokens if (m := _PARAM.match(t)))

    def at(self, **values: str) -> BoundSubject[T]:
        """The concrete subject for these parameter values (all required)."""
        missing = set(self.params) - set(values)
        unknown = set(values) - set(self.params)
        if missing or unknown:
            raise ValueError(
                f"{self.pattern}: missing {sorted(missing)}, unknown {sorted(unknown)}"
            )
        return BoundSubject(self, self._fill(values, default=None))

    def filter(self, **values: str) -> BoundSubject[T]:
        """A wildcard subject: parameters not given match any single token."""
        unknown = set(values) - set(self.params)
        if unknown:
            raise ValueError(f"{self.pattern}: unknown parameters {sorted(unknown)}")
        return BoundSubject(self, self._fill(values, default="*"))

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
    f"{ROOT}.cluster.node.{{name}}", NodeChanged, "a node was added, changed or removed"
)
POD_CHANGED = Subject(
    f"{ROOT}.cluster.pod.{{namespace}}.{{name}}", PodChanged, "a pod changed phase, node or owner"
)
FORECAST = Subject(
    f"{ROOT}.forecast.{{namespace}}.{{workload}}",
    ForecastIssued,
    "demand forecast for a serving workload",
)
PLAN_DECIDED = Subject(
    f"{ROOT}.plan.decided.{{policy}}",
    PlanDecided,
    "the planner's decision with a reason per target",
)
PLANNER_STATUS = Subject(
    f"{ROOT}.planner.status.{{planner}}",
    PlannerStatus,
    "leadership and degraded-mode changes of a planner",
)
SCALE_COMMAND = Subject(
    f"{ROOT}.scale.command.{{namespace}}.{{kind}}.{{name}}",
    ScaleCommand,
    "desired scale of one target (JetStream, acked by an executor)",
    durable=True,
)
SCALE_RESULT = Subject(
    f"{ROOT}.scale.result.{{namespace}}.{{kind}}.{{name}}",
    ScaleResult,
    "what an executor did with a scale command",
    durable=True,
)
SHARD_TASK = Subject(
    f"{ROOT}.training.task.{{job}}",
    ShardTask,
    "one shard of one epoch for a job's trainers (JetStream work queue)",
    durable=True,
)
JOB_PROGRESS = Subject(
    f"{ROOT}.training.progress.{{job}}", JobProgress, "epoch and shard progress of a training job"
)
TRAINER_MEMBERSHIP = Subject(
    f"{ROOT}.training.member.{{job}}.{{trainer}}",
    TrainerMembership,
    "a trainer joined, left or crashed",
)
DEAD_LETTER = Subject(
    f"{ROOT}.deadletter.{{consumer}}",
    DeadLetter,
    "a message a subscriber rejected, with the reason",
    durable=True,
)

# Any: each element binds a different model; `Subject` is invariant to keep publish() typed.
ALL_SUBJECTS: tuple[Subject[Any], ...] = (
    NODE_CHANGED,
    POD_CHANGED,
    FORECAST,
    PLAN_DECIDED,
    PLANNER_STATUS,
    SCALE_COMMAND,
    SCALE_RESULT,
    SHARD_TASK,
    JOB_PROGRESS,
    TRAINER_MEMBERSHIP,
    DEAD_LETTER,
)
