"""Lending: room serving holds but does not need, lent to training.

* `gpu_loan`: GPU serving replicas nothing needs (demand now, the forecast's quantile over the
  lead time, its median until the finite GPU jobs are done), lent to those jobs;
* `batch`: jobs that opted into batch capacity, planned on serving's idle reservation (what
  it reserves but does not use), the first to shrink when its usage rises.

Builds on serving (what it sized) and training (batch trainers are planned tier by tier as
the others are); the plan composes it after both.
"""

from tideshift.services.planner.core.lending.batch import (
    BatchPlan,
    hold_released_room,
    plan_on_batch_room,
    split_batch,
)
from tideshift.services.planner.core.lending.gpu_loan import lend_gpu_room

__all__ = [
    "BatchPlan",
    "hold_released_room",
    "lend_gpu_room",
    "plan_on_batch_room",
    "split_batch",
]
