"""What a plan publishes, built from its decision: the commands' idempotency keys and the
`PlanDecided` event (planned, pinned, paused and skipped targets, with why)."""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime

from tideshift.events import PlanDecided
from tideshift.events.models import TargetDecision as EventTargetDecision
from tideshift.services.planner import core as pol
from tideshift.services.planner.core.targets import Held

KEY_LIMIT = 256  # ScaleCommand.idempotency_key's max_length


def idempotency_key(plan_id: str, target: pol.Target) -> str:
    """`<plan>:<target>`, or `<plan>:sha256:<digest of target>` when that would not fit:
    unique per target per plan for the longest legal names too."""
    key = f"{plan_id}:{target}"
    if len(key) <= KEY_LIMIT:
        return key
    return f"{plan_id}:sha256:{hashlib.sha256(str(target).encode()).hexdigest()}"


def skipped_held(inputs: pol.PlanInputs, skipped: Mapping[pol.Target, str]) -> list[Held]:
    """The targets the policy raised on, in the inputs' order: each keeps its last good
    decision, what it is known to want."""
    roles: list[tuple[pol.Target, pol.Role]] = [(w.target, "serving") for w in inputs.serving]
    roles += [(j.target, "training") for j in inputs.jobs]
    return [
        Held(t, role, inputs.current.get(t, 0), inputs.current.get(t, 0), skipped[t])
        for t, role in roles
        if t in skipped
    ]


def plan_decided(
    decision: pol.Decision,
    *,
    policy: str,
    plan_id: str,
    now: float,
    held: Sequence[Held],
    skipped: Sequence[Held] = (),
) -> PlanDecided:
    """The `PlanDecided`: pinned, paused and skipped targets beside the planned ones, with
    why; skipped ones are marked so (the executor records a Warning Event on each)."""
    shown: list[pol.TargetDecision | Held] = [*decision.targets, *held, *skipped]
    marked = {item.target for item in skipped}
    return PlanDecided(
        plan_id=plan_id,
        policy=policy,
        decided_at=datetime.fromtimestamp(now, UTC),
        targets=tuple(
            EventTargetDecision(
                target=item.target,
                current=max(item.current, 0),
                desired=item.desired,
                reason=item.reason,
                skipped=item.target in marked,
                headroom=getattr(item, "headroom", None),
            )
            for item in shown
        ),
        infeasible=tuple(f"{item.target}: {item.reason}" for item in decision.infeasible),
    )
