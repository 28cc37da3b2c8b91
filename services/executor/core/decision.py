"""What to do with one scale command, given the target's state and the last command applied.

Pure: no I/O, no clock, no asyncio; the caller passes everything in.

* Replays: a command whose idempotency key is the one last applied to the target is a no-op.
* Stale commands: one issued before the last command recorded for the target is a no-op
  (a newer decision has already been made; applying the older one would undo it). Issue
  times are the issuer's clock: one further ahead of the executor's than `MAX_SKEW` is
  recorded as `now + MAX_SKEW` (`clamp_issued_at`), so a command stamped in year 9999
  cannot make every later command look older than it for ever; it holds them off for the
  skew at most.
* Bounds: the desired count is clamped into the target's [min, max].
* Max step: the change from the current count is limited to `max_step` (0 = no limit), so a
  bad forecast or a typo moves a target by a bounded amount per command.
* Admission: only targets that joined Tideshift (their own `tideshift.io/role` label, or
  listed by the operator), in the allowed namespaces if any are set, are acted on; whoever
  can publish a command cannot make the executor scale anything else its RBAC reaches.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Literal

from pydantic import AwareDatetime, BaseModel, ConfigDict, Field

from tideshift.services.cluster.port import ROLE_LABEL, ScaleState, WorkloadRef

# How far ahead of the executor's clock an issuer's may run before its stamps are clamped.
MAX_SKEW = timedelta(seconds=30)


def clamp_issued_at(issued_at: datetime, now: datetime) -> datetime:
    """The issue time, never later than `now + MAX_SKEW`."""
    return min(issued_at, now + MAX_SKEW)


class AppliedRecord(BaseModel):
    """The last command an executor took on for a target (kept in NATS KV)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    idempotency_key: str = Field(min_length=1)
    issued_at: AwareDatetime
    desired: int = Field(ge=0)
    applied: bool = Field(description="False while the write may not have happened yet")


@dataclass(frozen=True)
class Admission:
    """Which targets the executor may act on."""

    managed_only: bool = True
    listed: frozenset[WorkloadRef] = frozenset()  # managed without the label
    namespaces: frozenset[str] = frozenset()  # empty: every namespace

    def refuse_namespace(self, target: WorkloadRef) -> str | None:
        """Why no command for this target's namespace is taken on, or None."""
        if not self.namespaces or target.namespace in self.namespaces:
            return None
        allowed = ", ".join(sorted(self.namespaces))
        return f"namespace {target.namespace!r} is not in allowed_namespaces ({allowed})"

    def refuse(self, state: ScaleState) -> str | None:
        """Why this target must not be scaled (namespace, not managed), or None."""
        target = state.target
        refusal = self.refuse_namespace(target)
        if refusal is not None or not self.managed_only or target in self.listed:
            return refusal
        if state.role in ("serving", "training"):
            return None
        return (
            f"not managed: {target} has no label {ROLE_LABEL}=serving|training "
            f"and is not in managed_targets"
        )


@dataclass(frozen=True)
class Decision:
    action: Literal["apply", "noop"]
    replicas: int
    notes: tuple[str, ...] = ()

    @property
    def message(self) -> str:
        return "; ".join(self.notes)


def screen(
    *, idempotency_key: str, issued_at: datetime, record: AppliedRecord | None
) -> str | None:
    """Why this command must not be applied (replay or stale), or None if it may be."""
    if record is None:
        return None
    if record.idempotency_key == idempotency_key:
        return "replay: already applied" if record.applied else None
    if issued_at < record.issued_at:
        return (
            f"stale: issued {issued_at.isoformat()}, before command "
            f"{record.idempotency_key} issued {record.issued_at.isoformat()}"
        )
    return None


def decide(desired: int, state: ScaleState, *, max_step: int) -> Decision:
    """The replica count to write (or none), with a note for every adjustment made."""
    if max_step < 0:
        raise ValueError("max_step must be >= 0")
    notes: list[str] = []
    target = max(desired, state.min_replicas)
    if state.max_replicas is not None:
        target = min(target, state.max_replicas)
    if target != desired:
        upper = "inf" if state.max_replicas is None else str(state.max_replicas)
        notes.append(f"desired {desired} clamped to bounds [{state.min_replicas}, {upper}]")
    if max_step and abs(target - state.replicas) > max_step:
        limited = state.replicas + (max_step if target > state.replicas else -max_step)
        notes.append(f"step limited to {max_step}: {state.replicas} -> {limited}, not {target}")
        target = limited
    if target == state.replicas:
        notes.append(f"already at {target}")
        return Decision("noop", target, tuple(notes))
    return Decision("apply", target, tuple(notes))
