"""A training job's fixed description, shared by its coordinator, pservers and trainers.

The coordinator writes it once to the KV bucket; the others wait for it, so a pserver or a
trainer needs nothing but the job name. It names the data (shard locations the user's code
reads) and the optimiser the pservers apply, never a model: the model's arrays are whatever
the first trainer initialises. Pure (pydantic only).
"""

from __future__ import annotations

from pydantic import AwareDatetime, BaseModel, ConfigDict, Field

from tideshift.services.trainer.core.layout import DEFAULT_MAX_PIECE_BYTES
from tideshift.services.trainer.core.optim import OptimizerSpec

MAX_SHARDS = 100_000


class JobSpec(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    job: str = Field(min_length=1, max_length=253)
    shards: tuple[str, ...] = Field(
        min_length=1, max_length=MAX_SHARDS, description="shard locations: paths or URIs"
    )
    optimizer: OptimizerSpec = OptimizerSpec()
    pservers: int = Field(gt=0, le=256, description="parameter servers the model is spread over")
    ack_wait_seconds: float = Field(gt=0, description="redelivery delay of an unacked task")
    max_piece_bytes: int = Field(
        default=DEFAULT_MAX_PIECE_BYTES,
        ge=1024,
        le=4 * 1024 * 1024,
        description="largest slice of an array in one message (below the NATS payload limit)",
    )

    @property
    def num_shards(self) -> int:
        return len(self.shards)

    def same_training(self, other: JobSpec) -> bool:
        """Whether `other` trains on the same data with the same optimiser and layout."""
        ignored = {"ack_wait_seconds"}
        return self.model_dump(exclude=ignored) == other.model_dump(exclude=ignored)


class StoredLayout(BaseModel):
    """The model's arrays (name, shape, dtype) as the first trainer initialised them."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    arrays: list[dict[str, object]]
    initialised_by: str
    # New with every initialisation: pservers and the coordinator serving another one know
    # the job was reset (`tideshift training reset`) and start over.
    generation: str = ""


class PServerProgress(BaseModel):
    """The most batches a pserver (index) is known to have applied, kept one KV round trip
    behind its pushes: what a successor restoring an older checkpoint has to re-train."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    applied: int = Field(ge=0)


class PersistedCoordinator(BaseModel):
    """The coordinator's state as stored in KV (see protocol.CoordinatorState.to_json)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    state: dict[str, object]


class MemberBeat(BaseModel):
    """A live trainer's entry in the members bucket; it expires unless renewed."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    job: str
    trainer: str
    at: AwareDatetime
