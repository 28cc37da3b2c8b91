"""A lower bound on the mean job completion time any policy reaches on a stream of identical
finite CPU jobs (one `work:` job group, no serving), from the scenario alone: how far below a
static partition's JCT a policy can go at all (issue 26 asks for 1.5x; on edl-training-only
this bound says no policy gets there).

Two facts hold for every schedule, whatever it does with trainers, restarts and order:

* a job runs at most at its maximum trainers, and starts no sooner than its start-up delay
  after it arrives: job i ends at or after arrival + startup + work / max ** exponent;
* k jobs running at once hold k x their parameter servers and at most what the cluster's
  cores leave them in trainers; n ** exponent being concave, the k jobs do the most work per
  second at equal sizes, so the cluster does at most R = max over k of
  k x min(max, (cores - k x servers) / k) ** exponent per second, from the first start on.
  The c-th job to finish ends no sooner than c x work / R after the first start.

The c-th completion is at least the larger of the two (the first taken as the c-th smallest
over the jobs), and the mean JCT at least their mean minus the mean arrival. Restarts, the
start-up of later jobs, packing per node and integer trainers only add to it. Pure."""

from __future__ import annotations

from dataclasses import dataclass

from tideshift.services.simulator.scenario import Scenario
from tideshift.services.simulator.world import job_arrivals


@dataclass(frozen=True)
class JctBound:
    mean_jct_s: float  # no policy's mean JCT is below this
    peak_rate: float  # R: the most work per second the cluster does
    jobs_at_peak: int  # how many jobs running at once reach R
    alone_s: float  # one job's time at its maximum trainers
    # one trainer's throughput per core (its parameter servers' cores shared) at these sizes
    per_core: dict[int, float]


def mean_jct_lower_bound(scenario: Scenario) -> JctBound:
    """The bound for `scenario`; ValueError (naming the field) on scenarios it does not
    cover."""
    groups = scenario.training.jobs
    work = groups[0].work if len(groups) == 1 else None
    if work is None:
        raise ValueError("training.jobs: expected one job group with work: set")
    if scenario.serving:
        raise ValueError("serving: expected none (the bound is for training alone)")
    group = groups[0]
    if group.trainer.gpu or any(node.gpu for node in scenario.nodes):
        raise ValueError("trainer.gpu / nodes.gpu: expected CPU jobs on CPU nodes")
    exponent = scenario.training.speedup_exponent
    cores = sum(node.count * node.cpu for node in scenario.nodes)
    servers = group.pservers * group.pserver.cpu
    trainer = group.trainer.cpu
    floor_cores = servers + group.min_trainers * trainer
    rates = {
        k: k * min(group.max_trainers, (cores - k * servers) / k / trainer) ** exponent
        for k in range(1, int(cores // floor_cores) + 1)
    }
    jobs_at_peak = max(rates, key=lambda k: rates[k])
    peak = rates[jobs_at_peak]
    alone = work / group.max_trainers**exponent
    arrivals = sorted(t for t, _, _ in job_arrivals(scenario))
    first_start = arrivals[0] + group.startup_delay_s
    ends = [
        max(arrival + group.startup_delay_s + alone, first_start + c * work / peak)
        for c, arrival in enumerate(arrivals, start=1)
    ]
    per_core = {
        n: n**exponent / (n * trainer + servers)
        for n in sorted({group.min_trainers, 40, 50, group.max_trainers})
        if group.min_trainers <= n <= group.max_trainers
    }
    return JctBound(
        mean_jct_s=(sum(ends) - sum(arrivals)) / len(arrivals),
        peak_rate=peak,
        jobs_at_peak=jobs_at_peak,
        alone_s=alone,
        per_core=per_core,
    )
