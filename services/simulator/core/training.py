"""How much work an elastic training job does, one model for `tideshift simulate` and the demo:
ready_trainers ** speedup_exponent per second while the job runs, none for `restart_cost_s`
after its trainer set changes. Pure: time is an argument; no clock, no I/O, no asyncio, NATS,
Kubernetes or services.common.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from tideshift.events.models import DEFAULT_SPEEDUP_EXPONENT


@dataclass(frozen=True)
class WorkModel:
    """How trainers turn into progress: sub-linear speed-up, a pause whenever the set changes
    (the job re-forms its ring or re-shards). The exponent is the training spec's default;
    the simulated jobs restart in 10 s unless a scenario says otherwise (the spec's default,
    the planner's assumption about a job that says nothing, is 30 s)."""

    speedup_exponent: float = DEFAULT_SPEEDUP_EXPONENT
    restart_cost_s: float = 10.0


@dataclass
class JobProgress:
    """One job's training work so far, advanced interval by interval."""

    started_at: float | None = None  # start of the first interval in which the job ran
    work: float = 0.0
    paused_until: float = -math.inf
    last_ready: int | None = None  # None until first seen: the set seen first is no restart

    def advance(
        self, begin: float, end: float, *, ready: int, running: bool, model: WorkModel
    ) -> None:
        """Account for [begin, end) with `ready` trainers seen at the interval's edge; a
        change in the set counts from `begin`, and only the part of the interval after the
        restart pause is productive."""
        if self.last_ready is None:
            self.last_ready = ready
        elif ready != self.last_ready:
            self.paused_until = begin + model.restart_cost_s
            self.last_ready = ready
        if not running:
            return
        if self.started_at is None:
            self.started_at = begin
        productive = end - max(begin, self.paused_until)
        if productive > 0:
            self.work += ready**model.speedup_exponent * productive

    def remaining(self, total: float | None) -> float | None:
        """What a job of `total` work still has to do, as the planner's remaining work (seconds
        at one trainer, as the running planner estimates it from the job's progress); None for
        a job that runs until the end."""
        return None if total is None else max(total - self.work, 0.0)
