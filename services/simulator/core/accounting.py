"""The cluster figures `tideshift simulate` and `tideshift demo` report, integrated by one code
path so the two tables mean the same thing.

Each caller describes an interval of simulated time with a `Sample` (what it saw at its start)
and `Accountant.add` integrates it:

* utilisation: requests of bound pods / allocatable, per resource, time-averaged; night
  utilisation the same for cpu over 00:00-06:00 of the simulated day;
* cpu used: what pods use / allocatable (serving's usage model, every other pod its requests,
  batch trainers what they borrow); cpu lent: the batch trainers' part of it;
* stranded: free capacity where no wanted trainer fits / allocatable, per resource;
* serving shortfall: request-seconds above ready replicas x capacity, and the minutes with any;
* serving starved minutes: minutes in which serving could not get what it used;
* training share of spare: training's cpu / (allocatable - what serving needs for the actual
  demand - other pods).

Pure: no clock, no I/O.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from tideshift.services.cluster.core.placement import FloatArray
from tideshift.services.core.constants import EPS, HOUR_S, MINUTE_S

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
