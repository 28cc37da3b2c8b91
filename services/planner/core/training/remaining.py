"""A finite training job's remaining work, estimated from its progress reports (the training
coordinator's `JobProgress`: epoch, epochs, shards, shards applied in the epoch, trainers).

The unit is the policy's (`TrainingJob.remaining_work`): seconds at one trainer, a job with
n trainers doing n ** speedup_exponent of them per second, as `tideshift simulate` counts
work. The rate is measured over the reports of the last `window_s`: shards applied per
trainer-effort second (the sum of each interval's length x trainers ** exponent at its
start), so a job measured at 10 trainers is estimated at 40 as well. Only a job that says
how many epochs it runs has an estimate; None stands for a long-running job (or one not yet
measured), which the policy leaves to its fair share.

Pure: time is an argument; no clock, no I/O.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from tideshift.services.core.constants import DAY_S

# A report stamped further ahead of the planner's clock than this is refused: it would hold
# the history's end in the future (no later report would count as newer).
FUTURE_SKEW_S = 30.0
# Reports kept per job (the oldest go first; closer ones are thinned, see `_kept`), and how
# far back the rate is measured.
MAX_REPORTS = 64
DEFAULT_WINDOW_S = 1800.0
# An estimate beyond this is no estimate (a job barely moving): seconds at one trainer.
MAX_REMAINING_WORK = 365 * DAY_S


@dataclass(frozen=True, slots=True)
class Report:
    """One progress report of a job, in the planner's time (Unix seconds)."""

    at: float
    epoch: int
    epochs: int | None  # None: the job runs until stopped
    shards: int  # per epoch
    applied_in_epoch: int
    trainers: int

    @property
    def done(self) -> int:
        """Shards applied since the job began."""
        return self.epoch * self.shards + min(self.applied_in_epoch, self.shards)

    @property
    def left(self) -> int | None:
        """Shards still to apply; None for a job of unknown length."""
        if self.epochs is None:
            return None
        return max(self.epochs * self.shards - self.done, 0)


@dataclass(frozen=True, slots=True)
class Refused:
    """Why a report was not folded in: `reason` is one word (a metric label)."""

    reason: str  # "future", "stale" or "backwards"
    detail: str


@dataclass(frozen=True, slots=True)
class History:
    """One job's recent reports, oldest first."""

    reports: tuple[Report, ...] = ()

    @property
    def last(self) -> Report | None:
        return self.reports[-1] if self.reports else None


def observe(
    history: History, report: Report, *, now: float, window_s: float = DEFAULT_WINDOW_S
) -> tuple[History, Refused | None]:
    """The history with `report` folded in, or the history unchanged and why the report was
    refused: stamped in the future, not newer than the last one, or gone backwards. A report
    whose plan changed (shards or epochs) starts a new history: the job was resubmitted."""
    if report.at > now + FUTURE_SKEW_S:
        return history, Refused("future", f"stamped {report.at - now:.0f} s in the future")
    last = history.last
    if last is not None and (last.shards, last.epochs) == (report.shards, report.epochs):
        if report.at <= last.at:
            return history, Refused("stale", "not newer than the last progress")
        if report.done < last.done:
            return history, Refused(
                "backwards",
                f"went backwards (epoch {report.epoch} shard {report.applied_in_epoch} after "
                f"epoch {last.epoch} shard {last.applied_in_epoch})",
            )
        return History(_kept(history.reports, report, window_s=window_s)), None
    return History((report,)), None


def _kept(reports: tuple[Report, ...], report: Report, *, window_s: float) -> tuple[Report, ...]:
    """`reports` and `report`, over `window_s` and the report before it (which starts the
    window's first interval), at most MAX_REPORTS. A coordinator reports every few seconds:
    the latest report replaces the one before it while the trainers did not change across
    them and the one before that is less than 2 x window_s / MAX_REPORTS old, so the history
    spans the window with room for as many changes of trainers (the rate stays exact: the
    dropped report split an interval run at one trainer count)."""
    spacing = 2 * window_s / MAX_REPORTS
    if (
        len(reports) >= 2
        and reports[-1].trainers == reports[-2].trainers
        and report.at - reports[-2].at < spacing
    ):
        reports = reports[:-1]
    inside = sum(1 for r in reports if r.at >= report.at - window_s)
    start = max(len(reports) - inside - 1, 0)
    return (*reports[start:], report)[-MAX_REPORTS:]


def remaining_work(history: History, *, speedup_exponent: float) -> float | None:
    """Seconds at one trainer the job still needs; 0 when it has applied every shard; None
    when its length is unknown, it has not been measured over one interval with trainers, or
    the estimate is out of bounds."""
    last = history.last
    if last is None or last.left is None:
        return None
    if last.left == 0:
        return 0.0
    effort = 0.0
    for before, after in zip(history.reports, history.reports[1:], strict=False):
        effort += (after.at - before.at) * math.pow(max(before.trainers, 0), speedup_exponent)
    applied = last.done - history.reports[0].done
    if applied <= 0 or effort <= 0:
        return None
    estimate = last.left * effort / applied
    return estimate if estimate <= MAX_REMAINING_WORK else None


def remaining_seconds(history: History, trainers: int, *, speedup_exponent: float) -> float | None:
    """Seconds the job still needs at `trainers` trainers (None as `remaining_work`)."""
    work = remaining_work(history, speedup_exponent=speedup_exponent)
    if work is None or trainers <= 0:
        return None
    return work / math.pow(trainers, speedup_exponent)
