"""Tideshift's event contract: models, subjects and the CloudEvents codec.

Decides what travels on the bus and how it is spelled. Imports nothing of ours (no
`services`, no `loadgen`); `tideshift.events.client` is the one module here that talks to NATS, so
users can react to events with this package alone.
"""

from tideshift.events.codec import Envelope, EventRejected, decode, encode
from tideshift.events.models import (
    DeadLetter,
    EventData,
    ForecastIssued,
    ForecastPoint,
    JobProgress,
    NodeChanged,
    PlanDecided,
    PlannerStatus,
    PodChanged,
    Resources,
    ScaleCommand,
    ScaleResult,
    ShardTask,
    TargetDecision,
    TrainerMembership,
    WorkloadRef,
)
from tideshift.events.subjects import (
    ALL_SUBJECTS,
    DEAD_LETTER,
    FORECAST,
    JOB_PROGRESS,
    NODE_CHANGED,
    PLAN_DECIDED,
    PLANNER_STATUS,
    POD_CHANGED,
    SCALE_COMMAND,
    SCALE_RESULT,
    SHARD_TASK,
    TRAINER_MEMBERSHIP,
    BoundSubject,
    Subject,
    mqtt_topic_filter,
)
from tideshift.events.tokens import decode_token, encode_token

__all__ = [
    "ALL_SUBJECTS",
    "DEAD_LETTER",
    "FORECAST",
    "JOB_PROGRESS",
    "NODE_CHANGED",
    "PLANNER_STATUS",
    "PLAN_DECIDED",
    "POD_CHANGED",
    "SCALE_COMMAND",
    "SCALE_RESULT",
    "SHARD_TASK",
    "TRAINER_MEMBERSHIP",
    "BoundSubject",
    "DeadLetter",
    "Envelope",
    "EventData",
    "EventRejected",
    "ForecastIssued",
    "ForecastPoint",
    "JobProgress",
    "NodeChanged",
    "PlanDecided",
    "PlannerStatus",
    "PodChanged",
    "Resources",
    "ScaleCommand",
    "ScaleResult",
    "ShardTask",
    "Subject",
    "TargetDecision",
    "TrainerMembership",
    "WorkloadRef",
    "decode",
    "decode_token",
    "encode",
    "encode_token",
    "mqtt_topic_filter",
]
