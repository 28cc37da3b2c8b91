"""Where a command's time goes: `tideshift_executor_phase_seconds{phase}` counts each step of an
applied command once, the scale-down marks only when replicas go down, and times what the
step awaited."""

from __future__ import annotations

import asyncio

from prometheus_client import REGISTRY

from tests.unit.executor.test_executor_events import WEB, command, executor
from tideshift.services.cluster.port import ScaleState, WorkloadRef

STEPS = ("read", "record_read", "claim", "write", "mark_applied", "event")


def observed(phase: str) -> tuple[float, float]:
    """(count, seconds) the phase's histogram holds so far."""
    labels = {"phase": phase}
    count = REGISTRY.get_sample_value("tideshift_executor_phase_seconds_count", labels) or 0.0
    total = REGISTRY.get_sample_value("tideshift_executor_phase_seconds_sum", labels) or 0.0
    return count, total


async def test_each_step_of_an_applied_scale_up_is_counted_once() -> None:
    made, _, _ = executor(ScaleState(WEB, replicas=2, role="serving"))
    before = {phase: observed(phase)[0] for phase in (*STEPS, "scale_down_marks")}
    result = await made.handle(command(WEB, 4))
    assert result.outcome == "applied"
    after = {phase: observed(phase)[0] for phase in (*STEPS, "scale_down_marks")}
    assert {phase: after[phase] - before[phase] for phase in after} == {
        **dict.fromkeys(STEPS, 1.0),
        "scale_down_marks": 0.0,
    }


async def test_the_scale_down_marks_are_timed_with_what_they_awaited() -> None:
    marked = asyncio.Event()

    async def slow_marks(target: WorkloadRef, keep: int) -> None:
        await asyncio.sleep(0.05)  # stands for listing the cluster: the phase must include it
        marked.set()

    made, _, _ = executor(ScaleState(WEB, replicas=4, role="serving"), before_scale_down=slow_marks)
    count, seconds = observed("scale_down_marks")
    result = await made.handle(command(WEB, 2))
    assert result.outcome == "applied" and marked.is_set()
    count_after, seconds_after = observed("scale_down_marks")
    assert count_after == count + 1
    assert seconds_after - seconds >= 0.05
