"""Serving's one priced decision: the level of demand a workload is sized for.

A replica held for a minute displaces its cpu request of training for that minute:
`cpu / 60` core-hours. A replica missing when demand needs it leaves one replica's worth of
demand (`capacity_rps`) unserved for that minute, which the user prices at `shortfall_price`
core-hours (`ServingPolicy.shortfall_price`, per workload). The k-th replica is worth holding
while the chance demand needs it, P(demand > (k - 1) x capacity), times the price is at least
its cost: the newsvendor's critical ratio. Serving is therefore sized at the demand quantile

    level = 1 - cpu / (60 x shortfall_price)

of the demand over the lead time, read from the two calibrated estimates of it the planner
has: the forecast's quantiles (events.models.QUANTILE_LEVELS; above the highest, the highest)
and the workload's own rises within one lead time (a split-conformal quantile,
serving/headroom.py). Worked example (tests/unit/planner/test_serving_price.py): a 1-core
replica at the default 10 core-hours per replica-minute is sized at 1 - 1 / 600 = 0.99833; a
4-core one at 0.99333; the same 1-core replica at 0.05 core-hours at 0.667.

Pure; no I/O, no clock."""

from __future__ import annotations

from tideshift.services.core.constants import HOUR_S, MINUTE_S
from tideshift.services.planner.core.model import ServingWorkload

# The level stays within these: below the median serving would be sized under the demand it
# expects, and a level of 1 asks a quantile no finite calibration window estimates.
MIN_LEVEL = 0.5
MAX_LEVEL = 0.99999


def replica_minute_cost(workload: ServingWorkload) -> float:
    """Core-hours of training one replica held for a minute displaces (its cpu request)."""
    return workload.replica_requests[0] * MINUTE_S / HOUR_S


def service_level(workload: ServingWorkload) -> float:
    """The demand quantile the workload is sized for: where the expected cost of a shortfall
    (the chance the next replica is needed x its price) meets the training it displaces."""
    level = 1.0 - replica_minute_cost(workload) / workload.shortfall_price
    return min(max(level, MIN_LEVEL), MAX_LEVEL)


def price_for(level: float, cpu: float) -> float:
    """The `shortfall_price` at which a replica requesting `cpu` cores is sized at `level`
    (the inverse of `service_level`): what a user who thinks in quantiles sets."""
    if not 0.0 < level < 1.0:
        raise ValueError(f"level: expected a fraction between 0 and 1, got {level!r}")
    return cpu * MINUTE_S / HOUR_S / (1.0 - level)
