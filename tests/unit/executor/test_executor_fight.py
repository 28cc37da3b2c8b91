"""Fights with another writer on virtual time: the detector (a pure function of the counts
seen and the time passed in), and the executor that holds a target, says so, and resumes."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime

import pytest
from prometheus_client import REGISTRY

from tests.unit.executor.test_executor_admission import FakeRecords, FakeScales, FixedClock
from tests.unit.executor.test_executor_events import FakeEvents
from tideshift.events import ScaleCommand
from tideshift.services.cluster.port import ScaleState, WorkloadRef
from tideshift.services.executor.core.fight import (
    FightPolicy,
    FightRecord,
    judge,
    write_bound,
    wrote,
)
from tideshift.services.executor.executor import (
    FIGHT_REASON,
    HELD_PREFIX,
    RESUMED_REASON,
    Executor,
    MemoryFightStore,
)
from tideshift.services.executor.settings import ExecutorSettings

WEB = WorkloadRef("shop", "Deployment.apps", "web")
POLICY = FightPolicy(max_overrides=3, window_s=600, quiet_s=900)


def test_a_count_other_than_the_one_written_is_one_override_counted_once() -> None:
    record = wrote(FightRecord(), 10)
    first = judge(record, seen=4, now=100.0, policy=POLICY)
    assert (first.verdict, first.overridden, first.record.overrides) == ("write", True, (100.0,))
    # forgotten until Tideshift writes again: the same change is not counted twice
    again = judge(first.record, seen=4, now=110.0, policy=POLICY)
    assert (again.verdict, again.overridden, again.record.overrides) == ("write", False, (100.0,))


def test_our_own_count_is_no_override() -> None:
    judged = judge(wrote(FightRecord(), 10), seen=10, now=5.0, policy=POLICY)
    assert (judged.verdict, judged.overridden, judged.record.written) == ("write", False, 10)


def test_the_nth_override_within_the_window_holds_the_target() -> None:
    record, verdicts = FightRecord(), []
    for step in range(3):
        judged = judge(wrote(record, 10), seen=4, now=60.0 * step, policy=POLICY)
        record = judged.record
        verdicts.append(judged.verdict)
    assert verdicts == ["write", "write", "hold"]
    assert record.held_since == 120.0
    assert "3 times within 600s" in judged.message and "--resume" in judged.message


def test_overrides_older_than_the_window_do_not_count() -> None:
    record = FightRecord()
    for at in (0.0, 400.0, 700.0, 1100.0):  # never 3 within 600 s
        judged = judge(wrote(record, 10), seen=4, now=at, policy=POLICY)
        assert judged.verdict == "write"
        record = judged.record
    assert record.overrides == (700.0, 1100.0)


def held_at(now: float, seen: int = 4) -> FightRecord:
    return FightRecord(overrides=(now,) * 3, held_since=now, seen=seen, changed_at=now)


def test_a_held_target_resumes_after_the_quiet_period_and_forgets_the_fight() -> None:
    record = held_at(1000.0)
    assert judge(record, seen=4, now=1899.0, policy=POLICY).verdict == "held"
    resumed = judge(record, seen=4, now=1900.0, policy=POLICY)
    assert (resumed.verdict, resumed.record, resumed.writes) == ("resume", FightRecord(), True)


def test_the_other_writer_changing_the_count_while_held_restarts_the_quiet_period() -> None:
    judged = judge(held_at(1000.0), seen=7, now=1500.0, policy=POLICY)
    assert (judged.verdict, judged.record.changed_at, judged.record.seen) == ("held", 1500.0, 7)
    assert judge(judged.record, seen=7, now=1900.0, policy=POLICY).verdict == "held"
    assert judge(judged.record, seen=7, now=2400.0, policy=POLICY).verdict == "resume"


def test_the_policy_refuses_nonsense() -> None:
    with pytest.raises(ValueError, match="max_overrides"):
        FightPolicy(max_overrides=0)
    with pytest.raises(ValueError, match="quiet_s"):
        FightPolicy(quiet_s=0)


def simulate_fight(policy: FightPolicy, *, seconds: float, reset_every: float) -> int:
    """Tideshift wants 10 each `reset_every / 2` s; a hostile writer resets to 4 each
    `reset_every` s. Tideshift's writes over the run."""
    record, replicas, writes, now = FightRecord(), 4, 0, 0.0
    step = reset_every / 2
    while now < seconds:
        if now % reset_every == 0:
            replicas = 4  # the hostile writer
        if replicas != 10:
            judged = judge(record, seen=replicas, now=now, policy=policy)
            record = judged.record
            if judged.writes:
                replicas, writes, record = 10, writes + 1, wrote(record, 10)
        now += step
    return writes


@pytest.mark.parametrize(
    ("policy", "seconds"),
    [(POLICY, 300.0), (POLICY, 3600.0), (FightPolicy(3, 600, 20), 300.0)],
)
def test_writes_in_a_fight_stay_within_the_stated_bound(
    policy: FightPolicy, seconds: float
) -> None:
    writes = simulate_fight(policy, seconds=seconds, reset_every=4.0)
    assert 0 < writes <= write_bound(policy, seconds)


def test_the_settings_make_the_policy_with_defaults_of_3_in_10_minutes() -> None:
    assert ExecutorSettings().fight_policy() == FightPolicy(3, 600.0, 900.0)


# -- the executor --------------------------------------------------------------------------


class Hostile:
    """A second writer: resets the fake cluster's replicas between commands."""

    def __init__(self, scales: FakeScales) -> None:
        self.scales = scales

    def reset(self, replicas: int) -> None:
        self.scales.state = replace(self.scales.state, replicas=replicas)


def counter(name: str) -> float:
    return REGISTRY.get_sample_value(name) or 0.0


def command(desired: int, n: int, clock: FixedClock) -> ScaleCommand:
    return ScaleCommand(
        target=WEB,
        desired=desired,
        reason="plan",
        plan_id=f"p{n}",
        issued_at=datetime.fromtimestamp(clock.at, UTC),
        idempotency_key=f"k{n}",
    )


async def test_the_executor_holds_a_fought_target_says_so_and_resumes_after_quiet() -> None:
    clock = FixedClock(1_000_000.0)
    scales, events, fights = (
        FakeScales(ScaleState(WEB, replicas=4, role="serving")),
        FakeEvents(),
        MemoryFightStore(),
    )
    made = Executor(
        scales,  # type: ignore[arg-type]
        FakeRecords(),  # type: ignore[arg-type]
        clock=clock,
        events=events,
        fights=fights,
        fight_policy=POLICY,
    )
    hostile = Hostile(scales)
    fights_before = counter("tideshift_executor_fights_total")
    outcomes = []
    for n in range(8):
        outcomes.append((await made.handle(command(10, n, clock))).outcome)
        hostile.reset(4)
        clock.at += 5
    assert scales.writes == [10, 10, 10]
    assert outcomes == ["applied"] * 3 + ["rejected"] * 5
    assert counter("tideshift_executor_fights_total") == fights_before + 1
    warnings = [told for told in events.told if told[2] == FIGHT_REASON]
    assert len(warnings) == 1 and warnings[0][1] == "Warning"
    held = await made.handle(command(10, 100, clock))
    assert held.message.startswith(HELD_PREFIX) and held.current == 4
    clock.at += 900
    resumed = await made.handle(command(10, 101, clock))
    assert (resumed.outcome, scales.writes[-1]) == ("applied", 10)
    assert events.told[-2][1:3] == ("Normal", RESUMED_REASON)


async def test_an_operator_resume_forgets_the_fight_at_once() -> None:
    clock = FixedClock(1_000_000.0)
    scales, fights = FakeScales(ScaleState(WEB, replicas=4, role="serving")), MemoryFightStore()
    fights.kept[WEB] = held_at(clock.at)
    made = Executor(scales, FakeRecords(), clock=clock, fights=fights)  # type: ignore[arg-type]
    assert (await made.handle(command(10, 1, clock))).outcome == "rejected"
    del fights.kept[WEB]  # what `tideshift scale --resume` does to the KV key
    assert (await made.handle(command(10, 2, clock))).outcome == "applied"
    assert scales.writes == [10]


async def test_without_a_fight_store_nothing_is_held() -> None:
    clock = FixedClock(1_000_000.0)
    scales = FakeScales(ScaleState(WEB, replicas=4, role="serving"))
    made = Executor(scales, FakeRecords(), clock=clock)  # type: ignore[arg-type]
    for n in range(6):
        await made.handle(command(10, n, clock))
        Hostile(scales).reset(4)
        clock.at += 5
    assert scales.writes == [10] * 6
