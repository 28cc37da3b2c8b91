"""Managed-only: the executor scales only targets that joined Tideshift, in allowed namespaces,
and answers anything else with a `rejected` result saying why (no read of its record, no
write)."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from datetime import UTC, datetime

import pytest

from tideshift.events import ScaleCommand
from tideshift.services.cluster.port import ScaleState, WorkloadRef
from tideshift.services.common.settings import parse_settings
from tideshift.services.executor.core.decision import MAX_SKEW, Admission, AppliedRecord
from tideshift.services.executor.executor import Executor
from tideshift.services.executor.service import ExecutorSettings

T0 = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)
WEB = WorkloadRef("shop", "Deployment.apps", "web")
LABELLED = ScaleState(WEB, replicas=2, role="serving")
UNLABELLED = ScaleState(WEB, replicas=2)


@dataclass
class FakeScales:
    """Our ScaleWriter port: one target's state; records every write."""

    state: ScaleState
    writes: list[int] = field(default_factory=list)

    async def get_scale(self, target: WorkloadRef) -> ScaleState:
        return replace(self.state, target=target)

    async def set_scale(self, target: WorkloadRef, replicas: int) -> ScaleState:
        self.writes.append(replicas)
        self.state = replace(self.state, replicas=replicas)
        return self.state


@dataclass
class FakeRecords:
    """Our RecordStore: counts reads so a refusal can be shown to cost none."""

    reads: int = 0
    kept: dict[WorkloadRef, AppliedRecord] = field(default_factory=dict)

    async def get(self, target: WorkloadRef) -> tuple[AppliedRecord | None, int | None]:
        self.reads += 1
        record = self.kept.get(target)
        return record, (1 if record else None)

    async def put(self, target: WorkloadRef, record: AppliedRecord, revision: int | None) -> int:
        self.kept[target] = record
        return (revision or 0) + 1


@dataclass
class FixedClock:
    at: float

    def now(self) -> float:
        return self.at

    async def sleep(self, seconds: float) -> None:
        self.at += seconds


def command(target: WorkloadRef, desired: int = 5) -> ScaleCommand:
    return ScaleCommand(
        target=target,
        desired=desired,
        reason="t",
        plan_id="p",
        issued_at=T0,
        idempotency_key=f"k-{target.name}-{desired}",
    )


@pytest.mark.parametrize(
    ("admission", "state", "refused"),
    [
        (Admission(), LABELLED, None),
        (Admission(), replace(LABELLED, role="training"), None),
        (Admission(), UNLABELLED, "not managed: Deployment.apps/shop/web has no label"),
        (Admission(), replace(LABELLED, role="other"), "not managed"),
        (Admission(listed=frozenset({WEB})), UNLABELLED, None),
        (Admission(managed_only=False), UNLABELLED, None),
        (Admission(namespaces=frozenset({"shop"})), LABELLED, None),
        (
            Admission(namespaces=frozenset({"a", "b"}), listed=frozenset({WEB})),
            LABELLED,
            "namespace 'shop' is not in allowed_namespaces (a, b)",
        ),
    ],
)
def test_admission_says_why_a_target_is_refused(
    admission: Admission, state: ScaleState, refused: str | None
) -> None:
    why = admission.refuse(state)
    if refused is None:
        assert why is None
    else:
        assert why is not None and why.startswith(refused)


async def test_an_unlabelled_target_is_rejected_and_never_written() -> None:
    port, records = FakeScales(UNLABELLED), FakeRecords()
    executor = Executor(port, records)  # type: ignore[arg-type]
    result = await executor.handle(command(WEB))
    assert result.outcome == "rejected"
    assert "tideshift.io/role" in result.message and "managed_targets" in result.message
    assert port.writes == [] and records.kept == {}


async def test_a_labelled_or_listed_target_is_scaled() -> None:
    for state, admission in ((LABELLED, Admission()), (UNLABELLED, Admission(listed={WEB}))):
        port = FakeScales(state)
        executor = Executor(port, FakeRecords(), admission=admission)  # type: ignore[arg-type]
        result = await executor.handle(command(WEB))
        assert (result.outcome, port.writes) == ("applied", [5])


async def test_a_namespace_outside_the_allowed_ones_costs_no_read() -> None:
    port, records = FakeScales(LABELLED), FakeRecords()
    admission = Admission(namespaces=frozenset({"other"}))
    executor = Executor(port, records, admission=admission)  # type: ignore[arg-type]
    result = await executor.handle(command(WEB))
    assert result.outcome == "rejected" and "allowed_namespaces" in result.message
    assert (records.reads, port.writes) == (0, [])


async def test_many_refused_names_leave_no_records_behind() -> None:
    records = FakeRecords()
    executor = Executor(FakeScales(UNLABELLED), records)  # type: ignore[arg-type]
    for index in range(2000):
        result = await executor.handle(command(replace(WEB, name=f"stranger-{index}")))
        assert result.outcome == "rejected"
    assert records.kept == {}


def test_settings_build_the_admission() -> None:
    settings = parse_settings(
        ExecutorSettings,
        [
            "--managed-targets",
            '["Deployment/shop/legacy"]',
            "--allowed-namespaces",
            '["shop"]',
        ],
        prog="tideshift run executor",
    )
    admission = settings.admission()
    assert admission.managed_only
    assert admission.listed == {WorkloadRef("shop", "Deployment.apps", "legacy")}
    assert admission.namespaces == {"shop"}


def test_a_malformed_managed_target_is_one_line_naming_the_field(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit) as exit_:
        parse_settings(
            ExecutorSettings, ["--managed-targets", '["web"]'], prog="tideshift run executor"
        )
    assert exit_.value.code == 2
    error = capsys.readouterr().err.strip().splitlines()[-1]
    assert "managed_targets" in error or "managed-targets" in error
    assert "Kind.group/namespace/name" in error


async def test_a_far_future_command_is_recorded_at_the_clamped_time() -> None:
    records = FakeRecords()
    clock = FixedClock(T0.timestamp())
    executor = Executor(FakeScales(LABELLED), records, clock=clock)  # type: ignore[arg-type]
    future = command(WEB).model_copy(update={"issued_at": datetime(9999, 1, 1, tzinfo=UTC)})
    assert (await executor.handle(future)).outcome == "applied"
    assert records.kept[WEB].issued_at == T0 + MAX_SKEW
