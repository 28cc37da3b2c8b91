"""Training: how many trainers each job gets, tier by tier.

* `tier`: one tier's plan, top to bottom (which trainers keep their nodes, fair shares, how
  far rebalancing goes, which shrinks wait, which growth pays its restarts, the decisions
  and their words), and `plan_training`, every tier in turn;
* `shares`: the tier solver (gangs all or nothing, weighted dominant-resource fairness packed
  per node, finite jobs shortest-remaining-first);
* `lifetime`: how long the room serving leaves free is expected to last (`Reclaim`);
* `admission`: which finite CPU jobs wait before they start;
* `remaining`: a finite job's remaining work from its progress reports.

Imports the shared model (`model`, `packing`, `peaks`) only: never serving or lending.
"""

from tideshift.services.planner.core.training.admission import Admission, queue_finite_jobs
from tideshift.services.planner.core.training.lifetime import Reclaim, expected_reclaim
from tideshift.services.planner.core.training.tier import (
    TierPlan,
    Trainers,
    plan_tier,
    plan_training,
    tier_priorities,
)

__all__ = [
    "Admission",
    "Reclaim",
    "TierPlan",
    "Trainers",
    "expected_reclaim",
    "plan_tier",
    "plan_training",
    "queue_finite_jobs",
    "tier_priorities",
]
