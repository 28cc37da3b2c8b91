"""The elastic-training contract: shard tasks a coordinator issues, a job's progress, and
trainers joining and leaving. Pydantic models only; imports nothing of the services."""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import AwareDatetime, Field, model_validator

from tideshift.events.models import EventData, KubeName


class ShardTask(EventData):
    """One unit of training work: shard `shard` of epoch `epoch` of a job's dataset."""

    event_name: ClassVar[str] = "training.task"

    job: KubeName
    epoch: int = Field(ge=0)
    shard: int = Field(ge=0)
    shards: int = Field(gt=0, description="shards per epoch")
    issued_at: AwareDatetime

    @model_validator(mode="after")
    def _shard_in_range(self) -> ShardTask:
        if self.shard >= self.shards:
            raise ValueError(f"shard {self.shard} out of range for {self.shards} shards")
        return self


class JobProgress(EventData):
    event_name: ClassVar[str] = "training.progress"

    job: KubeName
    state: Literal["running", "finished"]
    epoch: int = Field(ge=0)
    epochs: int | None = Field(default=None, gt=0)
    shards: int = Field(gt=0)
    applied_in_epoch: int = Field(ge=0)
    applied_total: int = Field(ge=0)
    in_flight: int = Field(ge=0)
    redelivered: int = Field(ge=0)
    trainers: int = Field(ge=0)
    logloss: float | None = None
    at: AwareDatetime


class TrainerMembership(EventData):
    event_name: ClassVar[str] = "training.member"

    job: KubeName
    trainer: str = Field(min_length=1, max_length=253)
    change: Literal["joined", "left", "crashed"]
    reason: str = ""
    at: AwareDatetime
