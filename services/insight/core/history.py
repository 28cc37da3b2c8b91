"""One target's decisions over time, from the plans, scale commands and results the history
stream kept: what `tideshift explain` prints. Pure: no I/O, no clock; the caller passes the
events in stream order.

A plan comes every few seconds and mostly repeats the last one, so consecutive plans that
leave the target where it was and want the same count fold into one step, which keeps the
first plan's reason, forecast and observation (why the target got there) and counts the rest.
Commands join their plan by `plan_id`; an operator's command (`tideshift scale`) has no plan
and is a step of its own. Results join their command by idempotency key.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from tideshift.events.models import (
    Headroom,
    PlanDecided,
    ScaleCommand,
    ScaleResult,
    WorkloadRef,
)

Kept = PlanDecided | ScaleCommand | ScaleResult


@dataclass
class Executed:
    """A scale command for the target and, once the executor answered, what it did."""

    command: ScaleCommand
    result: ScaleResult | None = None

    def as_json(self) -> dict[str, Any]:
        result = self.result
        return {
            "idempotency_key": self.command.idempotency_key,
            "issuer": self.command.issuer,
            "issued_at": self.command.issued_at.isoformat(),
            "desired": self.command.desired,
            "outcome": result.outcome if result else None,
            "previous": result.previous if result else None,
            "current": result.current if result else None,
            "message": result.message if result else None,
            "executed_at": result.executed_at.isoformat() if result else None,
        }

    def describe(self) -> str:
        """`applied 18 -> 24 at 10:05:03` (observe mode: `would_scale ...`)."""
        result, command = self.result, self.command
        if result is None:
            return f"command {command.desired} by {command.issuer}: no result yet"
        moved = f"{result.previous} -> {result.current}" if result.previous is not None else ""
        text = f"{result.outcome} {moved} at {result.executed_at:%H:%M:%S}".replace("  ", " ")
        return text + (f" ({result.message})" if result.message else "")


@dataclass
class Step:
    """A run of plans that kept one decision about the target (or an operator's command)."""

    at: datetime
    last_at: datetime
    plans: int
    current: int | None
    desired: int
    reason: str
    skipped: bool = False
    headroom: Headroom | None = None
    executed: list[Executed] = field(default_factory=list)

    @property
    def pinned(self) -> bool:
        # The planner's words for a pin (`planner/core/targets.py`, `pin_reason`).
        return self.reason.startswith("pinned at ")

    def as_json(self) -> dict[str, Any]:
        return {
            "at": self.at.isoformat(),
            "last_at": self.last_at.isoformat(),
            "plans": self.plans,
            "current": self.current,
            "desired": self.desired,
            "forecast_rps": self.headroom.forecast if self.headroom else None,
            "observed_rps": self.headroom.observed if self.headroom else None,
            "rise_rps": self.headroom.rise if self.headroom else None,
            "rise_ratio": self.headroom.rise_ratio if self.headroom else None,
            "panic_hold": self.headroom.panic_hold if self.headroom else None,
            "recurring_period_s": self.headroom.recurring_period_s if self.headroom else None,
            "pinned": self.pinned,
            "skipped": self.skipped,
            "reason": self.reason,
            "executed": [item.as_json() for item in self.executed],
        }


def decisions(target: WorkloadRef, kept: Iterable[Kept]) -> list[Step]:
    """The target's steps, oldest first."""
    events = list(kept)
    # Joined by id, not by order: the history receives plans directly and its copies of
    # commands and results through its source, later.
    waiting: dict[str, list[Executed]] = {}  # commands by plan id
    for event in events:
        if isinstance(event, ScaleCommand) and event.target == target:
            waiting.setdefault(event.plan_id, []).append(Executed(event))
    results = {
        e.idempotency_key: e for e in events if isinstance(e, ScaleResult) and e.target == target
    }
    for executed in (item for items in waiting.values() for item in items):
        executed.result = results.get(executed.command.idempotency_key)
    steps: list[Step] = []
    for event in events:
        if isinstance(event, PlanDecided):
            _apply_plan(steps, target, event, waiting.pop(event.plan_id, []))
    for orphans in waiting.values():  # operators' commands, or plans older than the window
        steps.extend(_own_step(item) for item in orphans)
    steps.sort(key=lambda step: step.at)
    return steps


def _apply_plan(
    steps: list[Step], target: WorkloadRef, plan: PlanDecided, executed: list[Executed]
) -> None:
    item = next((t for t in plan.targets if t.target == target), None)
    if item is None:
        return
    last = steps[-1] if steps else None
    same = last is not None and (last.current, last.desired, last.skipped) == (
        item.current,
        item.desired,
        item.skipped,
    )
    if last is not None and same and not executed:
        last.last_at = plan.decided_at
        last.plans += 1
        return
    steps.append(
        Step(
            at=plan.decided_at,
            last_at=plan.decided_at,
            plans=1,
            current=item.current,
            desired=item.desired,
            reason=item.reason,
            skipped=item.skipped,
            headroom=item.headroom,
            executed=executed,
        )
    )


def _own_step(executed: Executed) -> Step:
    command = executed.command
    return Step(
        at=command.issued_at,
        last_at=command.issued_at,
        plans=0,
        current=executed.result.previous if executed.result else None,
        desired=command.desired,
        reason=f"{command.issuer}: {command.reason}",
        executed=[executed],
    )


def in_force(steps: Sequence[Step], at: datetime) -> Step | None:
    """The step that held at `at`: the last one that began at or before it."""
    before = [step for step in steps if step.at <= at]
    return before[-1] if before else None


def render(target: WorkloadRef, steps: Sequence[Step], *, since: datetime) -> str:
    """The steps as an operator reads them, one block per step."""
    plans = sum(step.plans for step in steps)
    lines = [
        f"{target}: {len(steps)} decisions over {plans} plans since {since:%Y-%m-%d %H:%M:%S}Z"
    ]
    for step in steps:
        span = f"{step.at:%H:%M:%S}"
        if step.last_at != step.at:
            span += f"-{step.last_at:%H:%M:%S} x{step.plans}"
        current = "?" if step.current is None else str(step.current)
        marks = "".join(
            f" [{word}]" for word, on in (("pinned", step.pinned), ("skipped", step.skipped)) if on
        )
        lines.append(f"{span}  {current} -> {step.desired}{marks}{_sizing(step.headroom)}")
        lines.append(f"    why: {step.reason}")
        lines.extend(f"    executor: {item.describe()}" for item in step.executed)
    return "\n".join(lines)


def _sizing(headroom: Headroom | None) -> str:
    if headroom is None:
        return ""
    text = (
        f"  forecast {headroom.forecast:.1f}, observed {headroom.observed:.1f}, "
        f"rise {headroom.rise:.1f} (x{headroom.rise_ratio:.2f}) req/s"
    )
    if headroom.recurring_period_s > 0:
        text += f", a rise recurring every {headroom.recurring_period_s / 60:.0f} min"
    return text + (" panic-hold" if headroom.panic_hold else "")
