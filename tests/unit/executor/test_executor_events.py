"""What the executor tells a target's owner: a Normal TideshiftScaled Event with old -> new and
the plan's reason for each applied command, Warnings for refused and failed ones, and in
observe mode a TideshiftWouldScale Event and a `would_scale` result with nothing written."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime

import pytest
from prometheus_client import REGISTRY

from tests.unit.executor.test_executor_admission import FakeRecords, FakeScales
from tideshift.events import ScaleCommand, ScaleResult
from tideshift.services.cluster.port import ScaleState, WorkloadRef
from tideshift.services.common.settings import parse_settings
from tideshift.services.executor.executor import (
    REFUSED_REASON,
    SCALED_REASON,
    WOULD_SCALE_REASON,
    Executor,
)
from tideshift.services.executor.service import ExecutorSettings

T0 = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)
WEB = WorkloadRef("shop", "Deployment.apps", "web")
CTR = WorkloadRef("ml", "Job.batch.volcano.sh", "ctr")
REASON = "forecast q0.95 peak 240.0 req/s over the next 90 s / 10 req/s per replica = 24"


@dataclass
class FakeEvents:
    """Our EventRecorder port: every Event asked for, as (target, type, reason, message)."""

    told: list[tuple[WorkloadRef, str, str, str]] = field(default_factory=list)
    broken: bool = False

    async def record_event(
        self, target: WorkloadRef, *, reason: str, message: str, event_type: str = "Warning"
    ) -> None:
        if self.broken:
            raise ConnectionError("apiserver unreachable")
        self.told.append((target, event_type, reason, message))


def lost_events() -> float:
    labels = {"reason": SCALED_REASON, "written": "false"}
    return REGISTRY.get_sample_value("tideshift_executor_events_total", labels) or 0.0


def command(target: WorkloadRef, desired: int, reason: str = REASON) -> ScaleCommand:
    return ScaleCommand(
        target=target,
        desired=desired,
        reason=reason,
        plan_id="p",
        issued_at=T0,
        idempotency_key=f"k-{target.name}-{desired}",
    )


def executor(state: ScaleState, **options: object) -> tuple[Executor, FakeScales, FakeEvents]:
    scales, events = FakeScales(state), FakeEvents()
    made = Executor(scales, FakeRecords(), events=events, **options)  # type: ignore[arg-type]
    return made, scales, events


async def test_an_applied_command_leaves_a_normal_event_with_old_new_and_the_reason() -> None:
    made, scales, events = executor(ScaleState(WEB, replicas=18, role="serving"))
    result = await made.handle(command(WEB, 24))
    assert (result.outcome, scales.writes) == ("applied", [24])
    assert events.told == [(WEB, "Normal", SCALED_REASON, f"18 -> 24: {REASON}")]


async def test_a_training_job_is_told_in_trainers_with_what_the_executor_changed() -> None:
    state = ScaleState(CTR, replicas=10, role="training", min_replicas=2, max_replicas=12)
    made, _, events = executor(state, max_step=3)
    await made.handle(command(CTR, 6, "-4 trainers: serving needs the room on nodes n1, n2"))
    ((_, kind, reason, message),) = events.told
    assert (kind, reason) == ("Normal", SCALED_REASON)
    assert message == (
        "-3 trainers (10 -> 7): -4 trainers: serving needs the room on nodes n1, n2 "
        "(step limited to 3: 10 -> 7, not 6)"
    )


async def test_no_event_when_nothing_changed() -> None:
    made, _, events = executor(ScaleState(WEB, replicas=5, role="serving"))
    assert (await made.handle(command(WEB, 5))).outcome == "noop"
    assert events.told == []


async def test_a_refused_command_is_a_warning() -> None:
    made, scales, events = executor(ScaleState(WEB, replicas=2))  # no role label
    assert (await made.handle(command(WEB, 5))).outcome == "rejected"
    assert scales.writes == []
    assert [(kind, reason) for _, kind, reason, _ in events.told] == [("Warning", REFUSED_REASON)]


async def test_an_event_that_cannot_be_written_costs_the_command_nothing() -> None:
    made, scales, events = executor(ScaleState(WEB, replicas=2, role="serving"))
    events.broken = True
    before = lost_events()
    assert (await made.handle(command(WEB, 5))).outcome == "applied"
    assert scales.writes == [5]
    assert lost_events() == before + 1


async def test_observe_mode_writes_nothing_and_says_what_it_would_do() -> None:
    made, scales, events = executor(ScaleState(WEB, replicas=18, role="serving"), observe=True)
    result: ScaleResult = await made.handle(command(WEB, 24))
    assert scales.writes == [] and made.records.kept == {}  # type: ignore[attr-defined]
    assert (result.outcome, result.previous, result.current, result.dry_run) == (
        "would_scale",
        18,
        24,
        True,
    )
    assert events.told == [(WEB, "Normal", WOULD_SCALE_REASON, f"would scale 18 -> 24: {REASON}")]
    # Already where the plan wants it: nothing to tell.
    assert (await made.handle(command(WEB, 18))).outcome == "noop"
    assert len(events.told) == 1


@pytest.mark.parametrize(
    ("argv", "env", "mode"),
    [([], {}, "act"), (["--mode", "observe"], {}, "observe"), ([], {"MODE": "observe"}, "observe")],
)
def test_mode_setting(
    argv: list[str], env: dict[str, str], mode: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name, value in env.items():
        monkeypatch.setenv(f"TIDESHIFT_{name}", value)
    assert parse_settings(ExecutorSettings, argv, prog="x").mode == mode


def test_a_mode_that_is_neither_is_refused_naming_the_setting(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit) as exit_:
        parse_settings(ExecutorSettings, ["--mode", "watch"], prog="x")
    assert exit_.value.code == 2
    assert "mode" in capsys.readouterr().err


def test_history_limits_come_from_the_settings() -> None:
    settings = ExecutorSettings(
        history_max_age_hours=48, history_max_bytes=2**24, history_max_messages=5000
    )
    stream = settings.history_stream().config()
    assert (stream.name, stream.max_age, stream.max_bytes, stream.max_msgs) == (
        "TIDESHIFT_HISTORY",
        48 * 3600,
        2**24,
        5000,
    )
    assert [source.name for source in stream.sources or []] == ["TIDESHIFT_SCALE"]
    assert stream.subjects == ["tideshift.v1.plan.decided.*", "tideshift.v1.planner.status.*"]
