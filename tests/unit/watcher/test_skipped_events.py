"""Skipped targets of a plan become Warning Events on their objects; one failing write does
not stop the others."""

from __future__ import annotations

from datetime import UTC, datetime

from tideshift.events import PlanDecided, TargetDecision, WorkloadRef
from tideshift.services.watcher.skipped import SKIPPED_REASON, warn_skipped

T0 = datetime(2026, 1, 1, tzinfo=UTC)


class Recorder:
    """Our EventRecorder port: records, and refuses one target to show isolation."""

    def __init__(self, refuse: str = "") -> None:
        self.refuse = refuse
        self.events: list[tuple[WorkloadRef, str, str]] = []

    async def record_event(self, target: WorkloadRef, *, reason: str, message: str) -> None:
        if target.name == self.refuse:
            raise RuntimeError("forbidden")
        self.events.append((target, reason, message))


def decision(name: str, *, skipped: bool) -> TargetDecision:
    reason = "skipped: cannot be planned (OverflowError: x)" if skipped else "planned"
    return TargetDecision.model_validate(
        {
            "target": WorkloadRef("ns", "Deployment.apps", name),
            "current": 2,
            "desired": 2,
            "reason": reason,
            "skipped": skipped,
        }
    )


def plan(*targets: TargetDecision) -> PlanDecided:
    return PlanDecided(plan_id="p", policy="tideshift", decided_at=T0, targets=targets)


async def test_each_skipped_target_gets_a_warning_with_the_plans_reason() -> None:
    recorder = Recorder()
    written = await warn_skipped(
        recorder,
        plan(
            decision("a", skipped=True), decision("b", skipped=False), decision("c", skipped=True)
        ),
    )
    assert written == 2
    assert [(ref.name, reason) for ref, reason, _ in recorder.events] == [
        ("a", SKIPPED_REASON),
        ("c", SKIPPED_REASON),
    ]
    assert recorder.events[0][2].startswith("skipped: cannot be planned")


async def test_one_refused_event_does_not_stop_the_others() -> None:
    recorder = Recorder(refuse="a")
    written = await warn_skipped(
        recorder, plan(decision("a", skipped=True), decision("c", skipped=True))
    )
    assert written == 1 and [ref.name for ref, _, _ in recorder.events] == ["c"]
