"""Training jobs' progress as the planner's input: the coordinators' `JobProgress` reports
(`tideshift.v1.training.progress.<job>`) folded into each job's recent history, and at each
plan every finite job's remaining work (core/training/remaining.py) set on its `TrainingJob`.

A report names its job by name only (the coordinator's `--job`): it applies to the planned
training job of that name, and to none when two namespaces hold one. Reports that cannot be
used are counted by reason (`tideshift_planner_progress_ignored_total`) and skipped, the first
of each reason per job logged: stamped in the future, older than the last, gone backwards, or
for a job the plan does not hold (never announced, or gone: its history is dropped).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

from prometheus_client import Counter

from tideshift.events.training import JobProgress
from tideshift.services.planner import core as pol
from tideshift.services.planner.core.training.remaining import (
    History,
    Report,
    observe,
    remaining_work,
)

log = logging.getLogger("tideshift.planner")

IGNORED = Counter(
    "tideshift_planner_progress_ignored_total",
    "Training progress reports the planner could not use, by reason",
    ["reason"],
)
# Histories held between plans (jobs reporting that no plan has matched yet are among them):
# beyond this many the least recently reported go first.
MAX_HISTORIES = 10_000


def report_of(event: JobProgress) -> Report:
    return Report(
        at=event.at.timestamp(),
        epoch=event.epoch,
        epochs=event.epochs,
        shards=event.shards,
        applied_in_epoch=event.applied_in_epoch,
        trainers=event.trainers,
    )


@dataclass
class ProgressBook:
    """Each reporting job's history, by job name, most recently reported last."""

    window_s: float
    histories: dict[str, History] = field(default_factory=dict)
    _logged: dict[str, set[str]] = field(default_factory=dict)  # reasons logged, per job

    def apply(self, event: JobProgress, now: float) -> None:
        """Fold one report in; a finished job's history goes (it is no longer planned)."""
        name = event.job
        if event.state == "finished":
            self._forget(name)
            return
        held = self.histories.pop(name, History())
        history, refused = observe(held, report_of(event), now=now, window_s=self.window_s)
        self.histories[name] = history
        if refused is not None:
            self._ignore(name, refused.reason, refused.detail)
        while len(self.histories) > MAX_HISTORIES:
            self._forget(next(iter(self.histories)))

    def attach(self, jobs: Sequence[pol.TrainingJob]) -> tuple[pol.TrainingJob, ...]:
        """`jobs` with each finite one's remaining work; histories of jobs not planned are
        dropped (counted: a coordinator of a job the planner does not manage, or gone)."""
        by_name: dict[str, list[int]] = {}
        for index, job in enumerate(jobs):
            by_name.setdefault(job.target.name, []).append(index)
        planned = list(jobs)
        for name in list(self.histories):
            rows = by_name.get(name)
            if rows is None:
                self._ignore(name, "unplanned", "its job is not a planned training target")
                # Its reasons stay logged: its coordinator goes on reporting.
                del self.histories[name]
            elif len(rows) > 1:
                self._ignore(name, "ambiguous", f"{len(rows)} planned jobs are named {name}")
            else:
                job = planned[rows[0]]
                work = remaining_work(self.histories[name], speedup_exponent=job.speedup_exponent)
                planned[rows[0]] = replace(job, remaining_work=work)
        return tuple(planned)

    def _ignore(self, name: str, reason: str, detail: str) -> None:
        IGNORED.labels(reason).inc()
        logged = self._logged.setdefault(name, set())
        if reason not in logged:
            logged.add(reason)
            log.warning("training progress of %s ignored: %s", name, detail)
        while len(self._logged) > MAX_HISTORIES:
            del self._logged[next(iter(self._logged))]

    def _forget(self, name: str) -> None:
        self.histories.pop(name, None)
        self._logged.pop(name, None)
