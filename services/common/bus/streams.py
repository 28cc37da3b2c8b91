"""JetStream streams, derived from the subjects that declare one (`Subject.stream`).

The events contract says *which* subjects are durable and in which stream; this module adds
only how long each stream keeps its messages. A durable subject without a stream here, or a
stream no subject names, fails at import, so the two cannot drift apart.
"""

from __future__ import annotations

from dataclasses import dataclass

from nats.js.api import DiscardPolicy, RetentionPolicy, StorageType, StreamConfig

from tideshift.events import ALL_SUBJECTS, DEAD_LETTER, SCALE_COMMAND, SHARD_TASK


@dataclass(frozen=True)
class StreamSpec:
    """A JetStream stream: the subjects that name it, and how long it keeps them."""

    name: str
    retention: RetentionPolicy = RetentionPolicy.LIMITS
    max_age_seconds: float = 24 * 3600
    duplicate_window_seconds: float = 120
    max_bytes: int = -1  # -1: no limit but age
    max_msgs: int = -1

    @property
    def subjects(self) -> tuple[str, ...]:
        """Every concrete subject of every pattern declared in this stream."""
        return tuple(s.filter().value for s in ALL_SUBJECTS if s.stream == self.name)

    def config(self) -> StreamConfig:
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


def _check_every_durable_subject_has_a_stream() -> None:
    declared = {s.stream for s in ALL_SUBJECTS if s.stream is not None}
    configured = {spec.name for spec in STREAMS}
    if declared != configured:
        raise RuntimeError(
            f"streams declared by subjects {sorted(declared)} != configured {sorted(configured)}"
        )


_check_every_durable_subject_has_a_stream()
