"""JetStream streams, derived from the subjects that declare one (`Subject.stream`).

The events contract says *which* subjects are durable and in which stream; this module adds
only how long each stream keeps its messages. A durable subject without a stream here, or a
stream no subject names, fails at import, so the two cannot drift apart.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import datetime

import nats.errors
import nats.js.errors
from nats.js.api import (
    AckPolicy,
    ConsumerConfig,
    DeliverPolicy,
    DiscardPolicy,
    RetentionPolicy,
    StorageType,
    StreamConfig,
    StreamSource,
)
from nats.js.client import JetStreamContext

from tideshift.events import ALL_SUBJECTS, DEAD_LETTER, SCALE_COMMAND, SHARD_TASK, buckets
from tideshift.events.subjects import PLAN_DECIDED, PLANNER_STATUS


@dataclass(frozen=True)
class StreamSpec:
    """A JetStream stream: the subjects that name it, and how long it keeps them."""

    name: str
    retention: RetentionPolicy = RetentionPolicy.LIMITS
    max_age_seconds: float = 24 * 3600
    duplicate_window_seconds: float = 120
    max_bytes: int = -1  # -1: no limit but age
    max_msgs: int = -1
    # Streams whose messages this one copies (JetStream sources) and keeps by its own limits.
    sources: tuple[str, ...] = ()
    # Core NATS subjects kept as well: published unacknowledged, so kept while it exists.
    kept: tuple[str, ...] = ()

    @property
    def subjects(self) -> tuple[str, ...]:
        """Every concrete subject of every pattern declared in this stream, and those kept."""
        declared = tuple(s.filter().value for s in ALL_SUBJECTS if s.stream == self.name)
        return declared + self.kept

    def config(self, *, replicas: int = 1) -> StreamConfig:
        """The stream's configuration, kept on `replicas` servers of a NATS cluster."""
        return StreamConfig(
            name=self.name,
            subjects=list(self.subjects),
            retention=self.retention,
            max_age=self.max_age_seconds,
            duplicate_window=self.duplicate_window_seconds,
            max_bytes=self.max_bytes,
            max_msgs=self.max_msgs,
            storage=StorageType.FILE,
            discard=DiscardPolicy.OLD,
            sources=[StreamSource(name=name) for name in self.sources] or None,
            num_replicas=replicas,
        )


# A stream's copies: one on a single server, three in a cluster (one server may be lost).
MAX_REPLICAS = 5
# JetStream's answers when it cannot place the copies asked for: replicas > 1 on a server
# not clustered, no suitable peers, insufficient resources.
_PLACEMENT_ERRORS = frozenset({10074, 10005, 10023})


class ReplicasUnavailable(ValueError):
    """The NATS server cannot keep as many copies of a stream as the setting asks."""


def check_replicas(replicas: int) -> int:
    """`replicas`, or ValueError naming the setting when it is outside 1..MAX_REPLICAS."""
    if not 1 <= replicas <= MAX_REPLICAS:
        raise ValueError(
            f"TIDESHIFT_NATS_REPLICAS (--nats-replicas) {replicas}: expected 1 to {MAX_REPLICAS}"
        )
    return replicas


def placement_failure(
    error: nats.js.errors.APIError, stream: str, replicas: int
) -> ReplicasUnavailable | None:
    """A one-line ReplicasUnavailable when `error` says the copies cannot be placed."""
    if error.err_code not in _PLACEMENT_ERRORS:
        return None
    return ReplicasUnavailable(
        f"TIDESHIFT_NATS_REPLICAS (--nats-replicas) {replicas}: the NATS server cannot keep "
        f"{replicas} copies of stream {stream} ({error.description}); expected at most its "
        "number of JetStream servers (1 when it is not clustered)"
    )


# Scale commands and results: a lost one is a missed or unreported scale.
SCALE_STREAM = StreamSpec(str(SCALE_COMMAND.stream))
# A work queue: a task leaves the stream when a trainer acks it.
TRAINING_TASK_STREAM = StreamSpec(
    str(SHARD_TASK.stream), retention=RetentionPolicy.WORK_QUEUE, max_age_seconds=7 * 24 * 3600
)
# Bounded by size and count too, discarding the oldest: a flood of poison must not fill the
# JetStream disk the scale commands need. 64 MiB holds ~20,000 letters of the largest kind.
DEAD_LETTER_STREAM = StreamSpec(
    str(DEAD_LETTER.stream),
    max_age_seconds=7 * 24 * 3600,
    max_bytes=64 * 1024 * 1024,
    max_msgs=100_000,
)
STREAMS: tuple[StreamSpec, ...] = (SCALE_STREAM, TRAINING_TASK_STREAM, DEAD_LETTER_STREAM)
# Decision history (`tideshift explain`, `tideshift status`): plans and planner statuses as
# published on core NATS, and a copy of every scale command and result, kept longer than the
# scale stream keeps them. Not in STREAMS: its limits are the executor's settings (the
# chart's `history` values), so the executor alone creates and updates it; these are the
# defaults.
HISTORY_STREAM = StreamSpec(
    "TIDESHIFT_HISTORY",
    max_age_seconds=7 * 24 * 3600,
    max_bytes=512 * 1024 * 1024,
    max_msgs=1_000_000,
    sources=(SCALE_STREAM.name,),
    kept=(PLAN_DECIDED.filter().value, PLANNER_STATUS.filter().value),
)


async def read_kept(
    js: JetStreamContext,
    stream: StreamSpec,
    filters: tuple[str, ...],
    *,
    since: datetime | None,
    batch: int = 256,
) -> AsyncIterator[tuple[str, bytes]]:
    """(subject, payload) of every message of `stream` on `filters` stored since `since`
    (None: the last one on each subject), oldest first, then stops: an ephemeral consumer
    that acks nothing, so reading the history never changes it."""
    config = ConsumerConfig(
        deliver_policy=(
            DeliverPolicy.LAST_PER_SUBJECT if since is None else DeliverPolicy.BY_START_TIME
        ),
        opt_start_time=since,
        ack_policy=AckPolicy.NONE,
        filter_subjects=list(filters),
        inactive_threshold=30.0,
    )
    try:
        info = await js.add_consumer(stream.name, config)
    except nats.js.errors.NotFoundError:
        raise LookupError(f"stream {stream.name} does not exist") from None
    subscription = await js.pull_subscribe_bind(info.name, stream=stream.name)
    try:
        pending = info.num_pending or 0
        while pending > 0:
            try:
                messages = await subscription.fetch(min(batch, pending), timeout=5.0)
            except nats.errors.TimeoutError:  # what was counted expired before delivery
                return
            for msg in messages:
                pending = msg.metadata.num_pending
                yield msg.subject, msg.data
    finally:
        await subscription.unsubscribe()
        await js.delete_consumer(stream.name, info.name)


# The trainer's membership keys expire unless renewed: the bucket's age limit is the
# membership TTL (`trainer.port.bus.MEMBER_TTL_SECONDS`; a test keeps the two equal).
TRAINER_MEMBER_TTL_SECONDS = 6.0


@dataclass(frozen=True)
class BucketSpec:
    """A key/value or object bucket (`events.buckets`), and the stream nats-server keeps it in."""

    name: str
    objects: bool = False
    ttl_seconds: float | None = None

    @property
    def stream(self) -> str:
        return f"{'OBJ' if self.objects else 'KV'}_{self.name}"


# Serving's rise history expires with the default rise window (`PolicyConfig.rise_window_s`,
# a day): a key of a workload that is gone is not kept for ever on a provisioned bus.
RISE_HISTORY_TTL_SECONDS = 86_400.0
_BUCKET_TTLS = {
    buckets.TRAINER_MEMBERS_BUCKET: TRAINER_MEMBER_TTL_SECONDS,
    buckets.RISE_HISTORY_BUCKET: RISE_HISTORY_TTL_SECONDS,
}

BUCKETS: tuple[BucketSpec, ...] = tuple(
    BucketSpec(
        name,
        objects=name == buckets.TRAINER_CHECKPOINTS_BUCKET,
        ttl_seconds=_BUCKET_TTLS.get(name),
    )
    for name in buckets.ALL_BUCKETS
)


def _check_every_durable_subject_has_a_stream() -> None:
    declared = {s.stream for s in ALL_SUBJECTS if s.stream is not None}
    configured = {spec.name for spec in STREAMS}
    if declared != configured:
        raise RuntimeError(
            f"streams declared by subjects {sorted(declared)} != configured {sorted(configured)}"
        )


_check_every_durable_subject_has_a_stream()
