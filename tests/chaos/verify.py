"""The final count of a scale-and-train chaos scenario: lost and doubled commands and shard
batches, put in its report, printed and asserted to be none."""

from __future__ import annotations

from collections.abc import Sequence

from tests.chaos.report import ChaosReport
from tideshift import events
from tideshift.services.trainer.port.pserver_client import PServerStatus


def assert_nothing_lost_or_doubled(
    report: ChaosReport,
    keys: Sequence[str],
    results: Sequence[events.ScaleResult],
    statuses: Sequence[PServerStatus],
    *,
    pairs: set[tuple[int, int]],
    total_batches: int,
) -> None:
    """Lost: a command with no result at all, or an (epoch, shard) pair never applied.
    Doubled: a command applied more than once (a redelivered command that found its own work
    done reports `noop`, which is right), or a batch applied beyond one apply each."""
    answered = {result.idempotency_key for result in results}
    applied = [result.idempotency_key for result in results if result.outcome == "applied"]
    report.checked = len(keys) + len(pairs)
    report.lost = sum(1 for key in keys if key not in answered)
    report.doubled = len(applied) - len(set(applied))
    for status in statuses:
        report.lost += len(pairs - status.applied)
        report.doubled += max(0, status.version - total_batches)
    report.print()
    assert (report.lost, report.doubled) == (0, 0)
    assert [status.version for status in statuses] == [total_batches]
