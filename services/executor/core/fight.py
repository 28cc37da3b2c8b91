"""Whether another writer is fighting Tideshift over a target's replicas, and whether to hold.

Pure: no I/O, no clock; times are Unix seconds the caller passes in.

An *override* is seen when a command finds the target at a count other than the one Tideshift
last wrote to it: someone else (a person with kubectl, a GitOps controller resetting the
manifest, another autoscaler) changed it since. Each override is counted once: after it the
count Tideshift wrote is forgotten until it writes again.

* `max_overrides` overrides within `window_s` make a fight: the target is *held*, Tideshift
  writes nothing to it and says so.
* A held target is released once the other writer has been quiet for `quiet_s` (no change of
  the count seen since the hold began, or since its last change), or at once by an operator
  (`tideshift scale --resume`, which forgets the fight).

The bound on Tideshift's writes follows: at most `max_overrides` writes before a hold, none
while held (at least `quiet_s`), so over a fight of T seconds at most
`max_overrides * (1 + T // quiet_s)` writes (`write_bound`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from tideshift.services.core.constants import MINUTE_S


@dataclass(frozen=True)
class FightPolicy:
    """When overrides make a fight, and how long a held target must be left alone."""

    max_overrides: int = 3
    window_s: float = 10 * MINUTE_S
    quiet_s: float = 15 * MINUTE_S

    def __post_init__(self) -> None:
        if self.max_overrides < 1:
            raise ValueError("max_overrides must be >= 1")
        if self.window_s <= 0 or self.quiet_s <= 0:
            raise ValueError("window_s and quiet_s must be > 0")


class FightRecord(BaseModel):
    """What is known of one target's writers (kept in NATS KV beside the applied records)."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    written: int | None = Field(
        default=None, ge=0, description="the count Tideshift last wrote; None once overridden"
    )
    overrides: tuple[float, ...] = Field(
        default=(), description="when overrides were seen, within the window"
    )
    held_since: float | None = Field(default=None, description="when the hold began")
    seen: int | None = Field(default=None, ge=0, description="the count last seen while held")
    changed_at: float | None = Field(
        default=None, description="when the other writer last changed the count while held"
    )


Verdict = Literal["write", "hold", "held", "resume"]


@dataclass(frozen=True)
class Judgement:
    """`write`: go ahead; `hold`: a fight just began (tell the owner); `held`: still held;
    `resume`: the quiet period is over, go ahead (tell the owner)."""

    verdict: Verdict
    record: FightRecord
    message: str = ""
    overridden: bool = False  # this command found another writer's change

    @property
    def writes(self) -> bool:
        return self.verdict in ("write", "resume")


def judge(record: FightRecord, *, seen: int, now: float, policy: FightPolicy) -> Judgement:
    """The verdict on a command for a target now at `seen` replicas, and the record after it."""
    if record.held_since is not None:
        return _while_held(record, record.held_since, seen=seen, now=now, policy=policy)
    overrides = tuple(at for at in record.overrides if now - at < policy.window_s)
    overridden = record.written is not None and seen != record.written
    if overridden:
        overrides += (now,)
    if len(overrides) < policy.max_overrides:
        written = None if overridden else record.written
        kept = FightRecord(written=written, overrides=overrides)
        return Judgement("write", kept, overridden=overridden)
    held = FightRecord(overrides=overrides, held_since=now, seen=seen, changed_at=now)
    message = (
        f"another writer changed replicas against the plan {len(overrides)} times within "
        f"{policy.window_s:.0f}s (last to {seen}); Tideshift stops writing this target until "
        f"it is left alone for {policy.quiet_s:.0f}s or `tideshift scale --resume`"
    )
    return Judgement("hold", held, message, overridden=overridden)


def _while_held(
    record: FightRecord, since: float, *, seen: int, now: float, policy: FightPolicy
) -> Judgement:
    changed_at = record.changed_at if record.changed_at is not None else since
    if record.seen is not None and seen != record.seen:
        changed_at = now
    quiet = now - changed_at
    if quiet >= policy.quiet_s:
        message = f"no other writer for {quiet:.0f}s: Tideshift writes this target again"
        return Judgement("resume", FightRecord(), message)
    kept = record.model_copy(update={"seen": seen, "changed_at": changed_at})
    message = (
        f"held: fighting another writer since {now - since:.0f}s ago; resumes after "
        f"{policy.quiet_s - quiet:.0f}s more without its changes or `tideshift scale --resume`"
    )
    return Judgement("held", kept, message)


def wrote(record: FightRecord, replicas: int) -> FightRecord:
    """The record after Tideshift wrote `replicas` to the target."""
    return record.model_copy(update={"written": replicas})


def write_bound(policy: FightPolicy, fight_s: float) -> int:
    """The most writes Tideshift makes to a target that another writer fights for `fight_s`."""
    return policy.max_overrides * (1 + int(fight_s // policy.quiet_s))
