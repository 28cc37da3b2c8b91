"""What `tideshift simulate` measures (and `tideshift demo` shares), in one place: the cluster
figures integrated over simulated time, trainer churn by cause, and the measures a user reads
off a run (issue 26). Pure: time is an argument, no clock, no I/O.

Cluster figures (`Sample`, `Accountant`), integrated by one code path so that `simulate`'s and
the demo's tables mean the same thing. Each caller describes an interval of simulated time with
a `Sample` (what it saw at its start) and `Accountant.add` integrates it:

* utilisation: requests of bound pods / allocatable, per resource, time-averaged; night
  utilisation the same for cpu over 00:00-06:00 of the simulated day;
* cpu used: what pods use / allocatable (serving's usage model, every other pod its requests,
  batch trainers what they borrow); cpu lent: the batch trainers' part of it;
* stranded: free capacity where no wanted trainer fits / allocatable, per resource;
* serving shortfall: request-seconds above ready replicas x capacity, and the minutes with any;
* serving starved minutes: minutes in which serving could not get what it used;
* training share of spare: training's cpu / (allocatable - what serving needs for the actual
  demand - other pods).

Trainer churn by cause (`ChurnCauses`): each step's trainer pods started and stopped while
their job went on, counted under what changed in the plan that caused them:

* `jobs`: a job arrived or finished since the previous plan (its gang, its parameter servers
  preempting trainers, the room a finished job frees);
* `serving`: otherwise, serving's desired replicas changed (room it takes or releases);
* `rebalancing`: neither: the policy moved trainers between running jobs on its own.

A plan that sees both an arrival and a serving change counts under `jobs`; pods that bind
later (waiting for room or a gang) count under the cause of the latest plan.

The user's measures (`StepMeasures`, `job_times`, `dominant_cores`):

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
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from tideshift.services.cluster.core.placement import FloatArray
from tideshift.services.cluster.port import WorkloadRef
from tideshift.services.core.constants import EPS, HOUR_S, MINUTE_S
from tideshift.services.planner.core.model import TargetDecision

# ---- cluster figures ------------------------------------------------------------------------

NIGHT_HOURS = (0.0, 6.0)  # hours of the simulated day with the least serving demand
RESOURCES = ("cpu", "memory", "gpu")


@dataclass(frozen=True)
class Sample:
    """What one interval looked like; vectors are (cpu, memory, gpu)."""

    allocatable: FloatArray
    requested: FloatArray  # requests of bound pods
    used_cpu: float  # what every pod uses, batch trainers included
    lent_cpu: float  # what batch trainers use on reclaimed capacity
    stranded: FloatArray
    # Per serving workload: one's spare capacity does not serve another's demand.
    demand_rps: tuple[float, ...]
    capacity_rps: tuple[float, ...]  # ready replicas x per-replica capacity
    spare_cpu: float  # allocatable - serving's need for the demand - other pods
    training_cpu: float  # training's cpu, on requests or lent
    starved: bool


@dataclass
class Accountant:
    """Integrates samples over simulated seconds since `start` (a midnight)."""

    start: float = 0.0
    elapsed_s: float = 0.0
    utilization_s: FloatArray = field(default_factory=lambda: np.zeros(3))
    night_s: float = 0.0
    night_cpu_s: float = 0.0
    used_cpu_s: float = 0.0
    lent_cpu_s: float = 0.0
    stranded_s: FloatArray = field(default_factory=lambda: np.zeros(3))
    demand_requests: float = 0.0
    shortfall_requests: float = 0.0
    shortfall_minutes: set[int] = field(default_factory=set)
    starved_minutes: set[int] = field(default_factory=set)
    spare_cpu_s: float = 0.0
    training_cpu_s: float = 0.0
    has: npt.NDArray[np.bool_] = field(default_factory=lambda: np.zeros(3, dtype=bool))  # > 0

    def add(self, begin: float, end: float, sample: Sample) -> None:
        """Account for [begin, end) as `sample` describes it."""
        dt = end - begin
        if dt <= 0:
            return
        alloc = sample.allocatable
        self.has = self.has | (alloc > 0)
        share = np.divide(sample.requested, alloc, out=np.zeros(3), where=alloc > 0)
        self.elapsed_s += dt
        self.utilization_s += share * dt
        if NIGHT_HOURS[0] <= ((begin - self.start) / HOUR_S) % 24 < NIGHT_HOURS[1]:
            self.night_s += dt
            self.night_cpu_s += share[0] * dt
        alloc_cpu = max(float(alloc[0]), EPS)
        self.used_cpu_s += sample.used_cpu / alloc_cpu * dt
        self.lent_cpu_s += sample.lent_cpu / alloc_cpu * dt
        self.stranded_s += np.divide(sample.stranded, alloc, out=np.zeros(3), where=alloc > 0) * dt
        self.demand_requests += sum(sample.demand_rps) * dt
        missing = sum(
            max(0.0, demand - capacity)
            for demand, capacity in zip(sample.demand_rps, sample.capacity_rps, strict=True)
        )
        if missing > EPS:
            self.shortfall_requests += missing * dt
            self.shortfall_minutes.update(self.minutes(begin, end))
        if sample.starved:
            self.starved_minutes.update(self.minutes(begin, end))
        self.spare_cpu_s += sample.spare_cpu * dt
        self.training_cpu_s += min(sample.training_cpu, sample.spare_cpu) * dt

    def minutes(self, begin: float, end: float) -> range:
        """The run-minutes [begin, end) touches."""
        first = math.floor((begin - self.start) / 60)
        last = math.floor((end - self.start - EPS) / MINUTE_S)
        return range(first, last + 1)

    def _mean(self, integral: float) -> float:
        return integral / self.elapsed_s if self.elapsed_s else 0.0

    def utilization(self, resources: tuple[str, ...] = RESOURCES) -> dict[str, float]:
        """Per resource the cluster has (and the caller asks for)."""
        return {
            name: self._mean(float(self.utilization_s[i]))
            for i, name in enumerate(RESOURCES)
            if name in resources and self.has[i]
        }

    def night_cpu_utilization(self) -> float | None:
        """Mean cpu requested / allocatable between 00:00 and 06:00 (None if not reached)."""
        return self.night_cpu_s / self.night_s if self.night_s else None

    @property
    def cpu_used(self) -> float:
        return self._mean(self.used_cpu_s)

    @property
    def cpu_lent(self) -> float:
        return self._mean(self.lent_cpu_s)

    def stranded(self) -> dict[str, float]:
        """Stranded cpu and GPUs (memory is not reported: it strands with cpu)."""
        return {
            name: self._mean(float(self.stranded_s[i]))
            for i, name in enumerate(RESOURCES)
            if name != "memory" and self.has[i]
        }

    @property
    def shortfall_fraction(self) -> float:
        return self.shortfall_requests / self.demand_requests if self.demand_requests else 0.0

    @property
    def training_share_of_spare(self) -> float:
        return self.training_cpu_s / self.spare_cpu_s if self.spare_cpu_s else 0.0


def trainer_churn(pods_bound: dict[str, int], pods_stopped: dict[str, int]) -> int:
    """Trainer pods started plus trainer pods stopped (a cluster's `SimCounters`)."""
    return pods_bound.get("training", 0) + pods_stopped.get("training", 0)


# ---- trainer churn by cause -------------------------------------------------------------------

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


# ---- the user's measures ----------------------------------------------------------------------

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
