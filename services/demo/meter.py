"""The figures the demo measures over its run (the same ones `tideshift simulate` reports,
through its accountant and its training-work model), and the series it plots.

No I/O and no clock: `Meter.record(now, cluster, demand)` is called by the demo with the
simulated time, so the accounting can be tested step by step.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from tideshift.services.cluster.port import Resources
from tideshift.services.cluster.sim import SimCluster
from tideshift.services.core.constants import HOUR_S
from tideshift.services.demo.figures import ClusterFigures, SimFigures
from tideshift.services.demo.world import GIB, WorldShape
from tideshift.services.planner.core import stranded_capacity
from tideshift.services.simulator.core.measures import Accountant, Sample
from tideshift.services.simulator.core.training import JobProgress
from tideshift.services.simulator.lending import resource_array


@dataclass
class Meter:
    """Integrates the run's figures over simulated time; samples series for the plot.

    The cluster figures (utilisation, cpu used and lent, stranded, shortfall, starved minutes,
    training's share of spare) go through `tideshift simulate`'s accountant
    (`simulator/core/measures.py`), so the two tables mean the same; training work goes through
    its work model (`simulator/core/training.py`).
    """

    shape: WorldShape
    start: float  # simulated time the run starts (Unix seconds)
    sample_every_s: float = 300.0
    last: float | None = None
    accounts: Accountant = field(init=False)
    jobs: dict[str, JobProgress] = field(default_factory=dict)
    series: dict[str, Any] = field(
        default_factory=lambda: {
            "t": [],
            "demand": [],
            "capacity": [],
            "replicas": [],
            "util_cpu": [],
            "trainers": {},
            # cores, stacked: serving in use, serving's idle reservation (not lent), training on
            # requests, training on reclaimed capacity (lent), free
            "cores_serving_used": [],
            "cores_serving_idle": [],
            "cores_training": [],
            "cores_lent": [],
            "cores_free": [],
            "stranded_cpu": [],  # free cores on nodes where no trainer that is wanted fits
        }
    )
    _next_sample: float = -math.inf

    def __post_init__(self) -> None:
        self.accounts = Accountant(start=self.start)

    def record(
        self,
        now: float,
        cluster: ClusterFigures | SimCluster,
        demand_rps: float,
        *,
        lent_cpu: float = 0.0,
        starved: bool = False,
    ) -> None:
        """Account for [last, now) with the state seen now (the demo ticks often): `lent_cpu`
        is what batch trainers use, `starved` whether serving's usage exceeded what it could
        get on some node."""
        if isinstance(cluster, SimCluster):
            cluster = SimFigures(cluster)
        if self.last is None:
            self.last = min(self.start, now)
        allocatable = cluster.allocatable_total()
        bound = cluster.bound_requests_total()
        serving = self.shape.serving
        ready = cluster.ready_count(serving.ref)
        capacity = ready * serving.capacity_rps
        cores = self._cores(cluster, demand_rps=demand_rps, ready=ready, bound=bound, lent=lent_cpu)
        stranded = self._stranded_cpu(cluster)
        if now > self.last:
            training_cpu = self._account_jobs((self.last, now), cluster)
            serving_cpu = cluster.bound_count(serving.ref) * serving.cpu
            other_cpu = bound.cpu - training_cpu - serving_cpu
            self.accounts.add(
                self.last,
                now,
                Sample(
                    allocatable=resource_array(allocatable),
                    requested=resource_array(bound),
                    used_cpu=cores["serving_used"] + cores["training"] + lent_cpu,
                    lent_cpu=lent_cpu,
                    stranded=np.array([stranded, 0.0, 0.0]),
                    demand_rps=(demand_rps,),
                    capacity_rps=(capacity,),
                    spare_cpu=max(
                        0.0, allocatable.cpu - serving.need(demand_rps) * serving.cpu - other_cpu
                    ),
                    training_cpu=training_cpu + lent_cpu,
                    starved=starved,
                ),
            )
        self.last = now
        if now >= self._next_sample:
            self._next_sample = now + self.sample_every_s
            self._sample(now, cluster, demand_rps, cores=cores, stranded=stranded)

    def _sample(
        self,
        now: float,
        cluster: ClusterFigures,
        demand_rps: float,
        *,
        cores: dict[str, float],
        stranded: float,
    ) -> None:
        """One point of each plotted series."""
        allocatable = cluster.allocatable_total()
        bound = cluster.bound_requests_total()
        serving = self.shape.serving
        ready = cluster.ready_count(serving.ref)
        self.series["t"].append(now - self.start)
        self.series["demand"].append(demand_rps)
        self.series["capacity"].append(ready * serving.capacity_rps)
        self.series["replicas"].append(ready)
        self.series["util_cpu"].append(bound.cpu / allocatable.cpu if allocatable.cpu else 0.0)
        for job in self.shape.jobs:
            self.series["trainers"].setdefault(job.name, []).append(cluster.ready_count(job.ref))
        for name in ("serving_used", "serving_idle", "training", "lent"):
            self.series[f"cores_{name}"].append(cores[name])
        unrequested_lent = max(cores["lent"] - cores["serving_idle_all"], 0)
        self.series["cores_free"].append(max(allocatable.cpu - bound.cpu - unrequested_lent, 0))
        self.series["stranded_cpu"].append(stranded)

    def _cores(
        self,
        cluster: ClusterFigures,
        *,
        demand_rps: float,
        ready: int,
        bound: Resources,
        lent: float,
    ) -> dict[str, float]:
        """Cores by use. Serving's usage model (as in `simulate`): its ready replicas are busy
        in proportion to demand / capacity, never beyond their requests. Lent cores are
        counted out of serving's idle reservation first, then out of unrequested cores."""
        serving = self.shape.serving
        serving_cpu = cluster.bound_count(serving.ref) * serving.cpu
        used = min(demand_rps / serving.capacity_rps, float(ready)) * serving.cpu
        used = min(used, serving_cpu)
        idle = serving_cpu - used
        return {
            "serving_used": used,
            "serving_idle_all": idle,
            "serving_idle": max(idle - lent, 0.0),
            "training": max(bound.cpu - serving_cpu, 0.0),  # trainers, pservers, other pods
            "lent": lent,
        }

    def _stranded_cpu(self, cluster: ClusterFigures) -> float:
        """Free cores on nodes where not one trainer of a job that wants more fits."""
        shapes = [
            (job.trainer_cpu, job.trainer_memory_gib * GIB, 0.0)
            for job in self.shape.jobs
            if not job.batch and cluster.bound_count(job.ref) < job.max_trainers
        ]
        free = cluster.free_room()
        return float(stranded_capacity(free, np.array(shapes).reshape(-1, 3))[0])

    def _account_jobs(self, interval: tuple[float, float], cluster: ClusterFigures) -> float:
        """Each job's training work over the interval; returns the CPU its pods request (a
        batch job's trainers request none)."""
        begin, now = interval
        training_cpu = 0.0
        for job in self.shape.jobs:
            trainers_cpu = 0.0 if job.batch else cluster.bound_count(job.ref) * job.trainer_cpu
            training_cpu += trainers_cpu + cluster.bound_companions(job.ref) * job.pserver_cpu
            # first sight: the job's current trainer set is no restart
            progress = self.jobs.setdefault(job.name, JobProgress())
            progress.advance(
                begin,
                now,
                ready=cluster.ready_count(job.ref),
                running=cluster.job_running(job.ref),
                model=self.shape.work,
            )
        return training_cpu

    def pending(self, end: float) -> list[float]:
        """Seconds from the start until each job first ran (until `end` if it never did)."""
        waits = []
        for job in self.shape.jobs:
            meter = self.jobs.get(job.name)
            started = meter.started_at if meter and meter.started_at is not None else end
            waits.append(started - self.start)
        return sorted(waits)

    def trainers_between(self, job: str, start_h: float, end_h: float) -> float | None:
        """Mean ready trainers of a job over sampled hours-of-day in [start_h, end_h)."""
        values = [
            count
            for t, count in zip(
                self.series["t"], self.series["trainers"].get(job, []), strict=False
            )
            if start_h <= (t / HOUR_S) % 24 < end_h
        ]
        return sum(values) / len(values) if values else None
