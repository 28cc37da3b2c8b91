"""The measures a user reads off `tideshift simulate` (issue 26): over-provisioning per serving
workload, the cluster's cpu split between training and serving, job completion and queueing
times per job group, and training work weighted by what a trainer uses.

* over-provisioning: ready capacity / demand, per step, per serving workload; steps with no
  demand have no ratio and are left out (their reservation shows in the serving cpu share).
  Beside it, what each part of Tideshift's headroom held (`HeadroomParts`), in replica-hours
  of its plans: `forecast` the replicas the forecast quantile alone asks, `rise` those the
  calibrated rise within one lead time adds, `observed` those observed demand adds on top,
  `held` what the plan kept above all three (panic hold, stabilisation, min_replicas);
* cpu shares: cpu held by trainers (requests, or what batch trainers use), serving's bound
  requests and what serving uses, each over allocatable, time-averaged over equal steps;
* job completion time (JCT): arrival to finish; queueing: arrival to first run. A job still
  unfinished (or never started) at the end counts the time up to the end, so both are lower
  bounds for it (as Lyra and Pollux count a truncated trace); `finished` says how many are exact.
  Makespan: first arrival to last finish, or to the end of the run when any job is unfinished;
* weighted work: each job's progress units times its trainer's dominant share of the cluster
  (max over cpu, memory and gpu of trainer request / allocatable, as DRF weighs a user) in cpu
  cores: a trainer holding one of 8 GPUs on a 64-core cluster weighs 8 cores, a 2-core trainer
  2. A GPU step is worth the scarce resource it holds, so a policy that strands GPUs to run
  cpu jobs does not look as productive as one that keeps the GPUs busy.

Pure: time is an argument, no clock, no I/O.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from tideshift.services.cluster.core.placement import FloatArray
from tideshift.services.core.constants import EPS, HOUR_S
from tideshift.services.planner.core.model import TargetDecision

HEADROOM_PARTS = ("forecast", "rise", "observed", "held")


def p95(ordered: Sequence[float]) -> float:
    """The 95th percentile of an ascending sequence (nearest rank); 0.0 when empty."""
    if not ordered:
        return 0.0
    return float(ordered[min(len(ordered) - 1, math.ceil(0.95 * len(ordered)) - 1)])


def _spread(values: Sequence[float]) -> dict[str, float]:
    ordered = sorted(values)
    if not ordered:
        return {"mean": math.nan, "p50": math.nan, "p95": math.nan}
    return {
        "mean": float(np.mean(ordered)),
        "p50": float(np.median(ordered)),
        "p95": p95(ordered),
    }


@dataclass
class StepMeasures:
    """Per-step figures integrated over a run of equal steps."""

    workloads: tuple[str, ...]
    capacity_rps: tuple[float, ...]  # per workload, for the headroom parts in replicas
    ratios: list[list[float]] = field(default_factory=list)
    headroom_s: dict[str, dict[str, float]] = field(default_factory=dict)  # replica-seconds
    steps: int = 0
    training_cpu: float = 0.0
    serving_reserved_cpu: float = 0.0
    serving_used_cpu: float = 0.0

    def __post_init__(self) -> None:
        self.ratios = [[] for _ in self.workloads]
        self.headroom_s = {name: dict.fromkeys(HEADROOM_PARTS, 0.0) for name in self.workloads}

    def add_plan(self, decisions: Sequence[TargetDecision], held_s: float) -> None:
        """One plan's serving decisions, held for `held_s`: replicas per headroom part."""
        capacity = dict(zip(self.workloads, self.capacity_rps, strict=True))
        for item in decisions:
            parts, cap = item.headroom, capacity.get(item.target.name)
            if parts is None or cap is None:
                continue
            forecast = math.ceil(parts.forecast / cap)
            rise = max(math.ceil(parts.rise / cap), forecast)
            observed = max(math.ceil(parts.observed / cap), rise)
            held = self.headroom_s[item.target.name]
            for name, replicas in zip(
                HEADROOM_PARTS,
                (forecast, rise - forecast, observed - rise, max(0, item.desired - observed)),
                strict=True,
            ):
                held[name] += replicas * held_s

    def add(
        self,
        demands: Sequence[float],
        capacities: Sequence[float],
        *,
        alloc_cpu: float,
        cpu: tuple[float, float, float],
    ) -> None:
        """One step: per-workload demand and ready capacity (req/s); cpu is (training,
        serving reserved, serving used) in cores."""
        for ratios, demand, capacity in zip(self.ratios, demands, capacities, strict=True):
            if demand > EPS:
                ratios.append(capacity / demand)
        alloc = max(alloc_cpu, EPS)
        self.steps += 1
        self.training_cpu += cpu[0] / alloc
        self.serving_reserved_cpu += cpu[1] / alloc
        self.serving_used_cpu += cpu[2] / alloc

    def over_provisioning(self) -> dict[str, dict[str, Any]]:
        """Per serving workload: mean and p95 of ready capacity / demand, and the replica-hours
        each headroom part held (all 0 for a policy without `HeadroomParts`)."""
        result = {}
        for name, ratios in zip(self.workloads, self.ratios, strict=True):
            spread = _spread(ratios)
            hours = {part: s / HOUR_S for part, s in self.headroom_s[name].items()}
            result[name] = {"mean": spread["mean"], "p95": spread["p95"], "replica_h": hours}
        return result

    def cpu_shares(self) -> dict[str, float]:
        steps = max(self.steps, 1)
        return {
            "training": self.training_cpu / steps,
            "serving_reserved": self.serving_reserved_cpu / steps,
            "serving_used": self.serving_used_cpu / steps,
        }


@dataclass(frozen=True)
class JobOutcome:
    group: str
    arrival: float
    started_at: float | None
    finished_at: float | None


def queueing(outcomes: Sequence[JobOutcome], end: float) -> list[float]:
    """Arrival to first run, ascending (a job that never ran counts up to the end)."""
    return sorted((end if o.started_at is None else o.started_at) - o.arrival for o in outcomes)


def job_times(outcomes: Sequence[JobOutcome], end: float) -> dict[str, Any]:
    """JCT and queueing (mean, p50, p95) overall and per job group, jobs finished, makespan."""

    def until(at: float | None) -> float:
        return end if at is None else at  # unfinished: counted up to the end

    def times(subset: Sequence[JobOutcome]) -> dict[str, Any]:
        return {
            "jct_s": _spread([until(o.finished_at) - o.arrival for o in subset]),
            "queueing_s": _spread(queueing(subset, end)),
            "finished": sum(1 for o in subset if o.finished_at is not None),
            "total": len(subset),
        }

    if not outcomes:
        return {}
    finishes = [o.finished_at for o in outcomes]
    last = max(until(f) for f in finishes)
    groups = sorted({o.group for o in outcomes})
    return {
        **times(outcomes),
        "makespan_s": last - min(o.arrival for o in outcomes),
        "groups": {g: times([o for o in outcomes if o.group == g]) for g in groups},
    }


def dominant_cores(trainer: Sequence[float], allocatable: FloatArray) -> float:
    """A trainer's dominant share of the cluster, in cpu cores (see the module docstring)."""
    share = np.divide(
        np.asarray(trainer, dtype=np.float64),
        allocatable,
        out=np.zeros(3),
        where=allocatable > 0,
    )
    return float(share.max()) * float(allocatable[0])
