"""What a run's trainer churn is made of: each step's trainer pods started and stopped while
their job went on, counted under what changed in the plan that caused them. Pure: no clock, no
I/O.

* `jobs`: a job arrived or finished since the previous plan (its gang, its parameter servers
  preempting trainers, the room a finished job frees);
* `serving`: otherwise, serving's desired replicas changed (room it takes or releases);
* `rebalancing`: neither: the policy moved trainers between running jobs on its own.

A plan that sees both an arrival and a serving change counts under `jobs`; pods that bind
later (waiting for room or a gang) count under the cause of the latest plan.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from tideshift.services.cluster.port import WorkloadRef
from tideshift.services.planner.core import TargetDecision

CAUSES = ("jobs", "serving", "rebalancing")


@dataclass
class ChurnCauses:
    """Trainer churn per cause, fed once per step with the run's churn so far."""

    counts: dict[str, int] = field(default_factory=lambda: dict.fromkeys(CAUSES, 0))
    cause: str = "jobs"
    seen: frozenset[WorkloadRef] = frozenset()  # the live jobs at the latest step
    planned: frozenset[WorkloadRef] = frozenset()  # and at the latest plan
    serving: tuple[int, ...] = ()  # serving's desired replicas at the latest plan
    counted: int = 0

    def observe_jobs(self, live: Iterable[WorkloadRef]) -> None:
        """An arrival or a finish between plans makes the churn that follows the jobs'."""
        seen = frozenset(live)
        if seen != self.seen:
            self.seen = seen
            self.cause = "jobs"

    def observe_plan(
        self, live: Iterable[WorkloadRef], decisions: Sequence[TargetDecision]
    ) -> None:
        planned = frozenset(live)
        serving = tuple(item.desired for item in decisions if item.role == "serving")
        if planned != self.planned:
            self.cause = "jobs"
        elif serving != self.serving:
            self.cause = "serving"
        else:
            self.cause = "rebalancing"
        self.seen = self.planned = planned
        self.serving = serving

    def count(self, churn_so_far: int) -> None:
        self.counts[self.cause] += churn_so_far - self.counted
        self.counted = churn_so_far
