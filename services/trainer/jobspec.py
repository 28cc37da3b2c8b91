"""A training job's fixed description, shared by its coordinator, pservers and trainers.

The coordinator writes it once to the KV bucket; the others wait for it, so a pserver or a
trainer needs nothing but the job name. Pure (pydantic only).
"""

from __future__ import annotations

from pydantic import AwareDatetime, BaseModel, ConfigDict, Field

from tideshift.services.trainer.model import DatasetSpec, KeyRange, ModelSpec, partition_keys


class JobSpec(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    job: str = Field(min_length=1, max_length=253)
    seed: int = Field(ge=0)
    shards: int = Field(gt=0)
    samples_per_shard: int = Field(gt=0)
    holdout_samples: int = Field(gt=0)
    field_cardinality: int = Field(gt=0)
    num_buckets: int = Field(gt=0)
    num_fields: int = Field(gt=0)
    learning_rate: float = Field(gt=0)
    l2: float = Field(ge=0)
    pservers: int = Field(gt=0, description="parameter servers, each owning one key range")
    ack_wait_seconds: float = Field(gt=0, description="redelivery delay of an unacked task")
    data_dir: str = Field(min_length=1)

    @property
    def model(self) -> ModelSpec:
        return ModelSpec(
            num_buckets=self.num_buckets,
            num_fields=self.num_fields,
            learning_rate=self.learning_rate,
            l2=self.l2,
        )

    @property
    def dataset(self) -> DatasetSpec:
        return DatasetSpec(
            seed=self.seed,
            num_shards=self.shards,
            samples_per_shard=self.samples_per_shard,
            holdout_samples=self.holdout_samples,
            field_cardinality=self.field_cardinality,
            model=self.model,
        )

    @property
    def key_ranges(self) -> tuple[KeyRange, ...]:
        return partition_keys(self.model.num_params, self.pservers)

    def same_training(self, other: JobSpec) -> bool:
        """Whether `other` trains the same model on the same data (paths may differ)."""
        ignored = {"data_dir", "ack_wait_seconds"}
        return self.model_dump(exclude=ignored) == other.model_dump(exclude=ignored)


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
