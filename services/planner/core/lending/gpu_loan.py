"""GPU serving replicas above what demand and the forecast need, lent to finite GPU jobs.

Serving's sizing adds to the forecast's peak a priced rise (where observed demand may be one
lead time on) and holds replicas while its scale-down waits. On GPU nodes those replicas hold
GPUs a finite GPU job short of its maximum could use (issue 26: "GPU jobs must never wait
behind headroom nobody uses"; on finite-jobs-gpu the GPU jobs ran at 7 of their 8 GPUs while
the inference service held one replica for its rise). A replica is lent when neither the
demand observed now, nor the forecast's quantile over the lead time, nor the forecast's median
until the jobs are done (as far as it reaches) needs it. Serving is sized again every plan:
a rise above what is left takes the room back at once, the trainers standing where the
replicas stood first.

Pure: time is an argument; no clock, no I/O.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from tideshift.services.core.constants import EPS
from tideshift.services.planner.core.model import (
    Forecast,
    HeadroomParts,
    PlanInputs,
    ServingWorkload,
    Target,
    TrainingJob,
)
from tideshift.services.planner.core.peaks import forecast_peak
from tideshift.services.planner.core.serving import ServingPlan

# Whether the replicas lent are needed before the job is done is a bet on the next hours
# (two restarts if lost), made on the forecast's median as serving's own release is.
AHEAD_QUANTILE = 0.5


@dataclass(frozen=True, slots=True)
class Loan:
    """Replicas one serving workload lends, and why (its reason's suffix)."""

    replicas: int
    reason: str


def lend_gpu_room(inputs: PlanInputs, serving: ServingPlan, now: float) -> ServingPlan:
    """`serving` with the replicas each GPU workload lends (`lend`) taken off, and said."""
    short, until_s = gpu_jobs_short(inputs.jobs, inputs.current)
    if until_s <= 0:
        return serving
    desired = list(serving.desired)
    decisions = list(serving.decisions)
    for row, workload in enumerate(inputs.serving):
        decision = decisions[row]
        # Replicas serving would add back now are, but for a rise, those lent last plan:
        # the trainers standing on them count as short, or the loan flips plan by plan.
        back = max(desired[row] - inputs.current.get(workload.target, desired[row]), 0)
        loan = lend(
            workload,
            inputs.forecasts.get(workload.target),
            decision.headroom,
            desired[row],
            short=short + back,
            until_s=until_s,
            now=now,
        )
        if loan.replicas <= 0:
            continue
        short -= loan.replicas
        desired[row] -= loan.replicas
        decisions[row] = replace(
            decision, desired=desired[row], reason=f"{decision.reason}; {loan.reason}"
        )
    return replace(serving, desired=tuple(desired), decisions=tuple(decisions))


def gpu_jobs_short(jobs: Sequence[TrainingJob], current: Mapping[Target, int]) -> tuple[int, float]:
    """GPU trainers the finite GPU jobs lack of their maxima, and the longest of their
    remaining times at what they hold now (seconds; at one trainer for a job with none)."""
    short, longest = 0, 0.0
    for job in jobs:
        if job.remaining_work is None or job.trainer_requests[2] <= 0 or job.batch:
            continue
        held = current.get(job.target, 0)
        short += max(job.max_trainers - held, 0)
        rate = max(held, 1) ** job.speedup_exponent
        longest = max(longest, job.remaining_work / rate + job.restart_cost_s)
    return short, longest


def lend(
    workload: ServingWorkload,
    forecast: Forecast | None,
    parts: HeadroomParts | None,
    desired: int,
    *,
    short: int,
    until_s: float,
    now: float,
) -> Loan:
    """What `workload` (at `desired` replicas) lends to GPU jobs lacking `short` trainers that
    are done within `until_s`. Nothing from a workload without GPUs or without a forecast in
    force."""
    none = Loan(0, "")
    if workload.replica_requests[2] <= 0 or short <= 0 or forecast is None or parts is None:
        return none
    per = workload.capacity_rps
    observed_need = math.ceil(parts.observed / per - EPS)
    forecast_need = math.ceil(parts.forecast / per - EPS)
    end = now + until_s + workload.lead_time_s + workload.margin_s
    peak = forecast_peak(forecast, now, end, AHEAD_QUANTILE)
    if peak is None:
        return none
    ahead = math.ceil(peak / per - EPS)
    keep = min(
        max(observed_need, forecast_need, ahead, workload.min_replicas), workload.max_replicas
    )
    lent = min(desired - keep, short)
    if lent <= 0:
        return none
    reach = min(end, forecast.times[-1]) - now
    return Loan(
        lent,
        f"{lent} held above what it needs lent to finite GPU jobs short of {short} GPUs "
        f"(done within {until_s:.0f} s): demand now, the q{workload.quantile:g} forecast "
        f"over the lead time and the median one over the next {reach:.0f} s need {keep}; "
        f"taken back when serving needs more",
    )
