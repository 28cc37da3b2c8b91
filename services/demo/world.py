"""The demo's simulated world: the cluster, its serving workload and elastic jobs, and the
figures measured over the run (the same ones `tideshift simulate` reports).

No I/O and no clock: `Meter.record(now, cluster, demand)` is called by the demo with the
simulated time, so the accounting can be tested step by step.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from tideshift.services.cluster.overcommit import OvercommitConfig
from tideshift.services.cluster.placement import FloatArray
from tideshift.services.cluster.port import Node, Pod, Resources, WorkloadRef
from tideshift.services.cluster.sim import SimCluster, SimWorkload
from tideshift.services.demo.lending import LendingCluster, resource_array
from tideshift.services.planner.policy import stranded_capacity
from tideshift.services.simulator.accounting import Accountant, Sample

GIB = float(2**30)
SERVING_KIND = "Deployment"
JOB_KIND = "ElasticJob"


@dataclass(frozen=True)
class ServingShape:
    """The serving workload; `capacity_rps` is one replica at 100 % (the sample app's)."""

    name: str = "web"
    namespace: str = "demo"
    cpu: float = 1.0
    memory_gib: float = 2.0
    capacity_rps: float = 50.0
    target_utilization: float = 0.8
    min_replicas: int = 4
    max_replicas: int = 400
    startup_delay_s: float = 60.0
    priority: int = 1000

    @property
    def ref(self) -> WorkloadRef:
        return WorkloadRef(self.namespace, SERVING_KIND, self.name)

    def need(self, rps: float) -> int:
        """Replicas the demand needs at the target utilisation (what `simulate` measures)."""
        need = math.ceil(rps / (self.capacity_rps * self.target_utilization) - 1e-9)
        return min(max(need, self.min_replicas), self.max_replicas)


@dataclass(frozen=True)
class JobShape:
    """One elastic training job: trainers (one real trainer process each) plus pservers."""

    name: str
    namespace: str = "demo"
    trainer_cpu: float = 12.0
    trainer_memory_gib: float = 24.0
    min_trainers: int = 1
    max_trainers: int = 16  # above what the policy can give (16 x 12 cores > the cluster)
    pservers: int = 1
    pserver_cpu: float = 1.0
    pserver_memory_gib: float = 2.0
    startup_delay_s: float = 120.0
    priority: int = 0
    weight: float = 1.0
    kind: str = JOB_KIND  # the sim's elastic job; batch/v1 `Job` (parallelism) on a real cluster
    # Trainers request tideshift.io/batch-cpu / batch-memory: they run on what serving
    # reserves but does not use (`lending.py`), not on requests.
    batch: bool = False

    @property
    def ref(self) -> WorkloadRef:
        return WorkloadRef(self.namespace, self.kind, self.name)


# Small trainers: a node full of serving replicas lends two or three cores, never twelve.
LENDING_JOB = JobShape(
    "ctr-lend", trainer_cpu=1.0, trainer_memory_gib=2.0, max_trainers=48, batch=True
)


@dataclass(frozen=True)
class WorldShape:
    """Sized so the day matters and training can take whatever serving leaves: at the
    6800 req/s peak serving needs ~170 of 192 cores, at the 1200 req/s trough ~30. Trainers
    are large (12 of a node's 16 cores), so about 13 real trainer processes fill the night
    and no job's cap binds; 1-core serving replicas fill the gaps beside them, and packing
    (MostAllocated placement, scale-downs that free whole nodes) keeps nodes whole for them.
    `tideshift demo` adds a fourth job (`demo_world`), batch: 1-core trainers on serving's
    idle reservation (`LENDING_JOB`). Each node keeps `lend_margin` of its allocatable back; the
    default 10 % is what a replica at 80 % target utilisation leaves idle, so 5 % (0.8 of 16
    cores, below one replica's core) lends two trainers per node of serving."""

    nodes: int = 12
    node_cpu: float = 16.0
    node_memory_gib: float = 64.0
    serving: ServingShape = ServingShape()
    jobs: tuple[JobShape, ...] = (JobShape("ctr-a"), JobShape("ctr-b"), JobShape("ctr-c"))
    lend_margin: float = 0.05
    restart_cost_s: float = 10.0  # as in `simulate`: no progress while a job re-forms
    speedup_exponent: float = 0.8


def demo_world(*, lend: bool) -> WorldShape:
    """The world `tideshift demo` runs: the three jobs on requests, plus the batch job that
    borrows serving's idle reservation unless `lend` is off (`--no-lend`)."""
    default = WorldShape()
    return WorldShape(jobs=(*default.jobs, LENDING_JOB)) if lend else default


def build_cluster(shape: WorldShape, *, now: float, initial_demand_rps: float) -> LendingCluster:
    """The cluster at `now`, serving sized for the initial demand, every job at its minimum."""
    cluster = LendingCluster(
        [
            Node(
                f"node-{i:02d}",
                Resources(shape.node_cpu, shape.node_memory_gib * GIB, 0),
                labels=(("tideshift.io/pool", "general"),),
            )
            for i in range(shape.nodes)
        ],
        now=now,
        batch_use={
            job.ref: Resources(job.trainer_cpu, job.trainer_memory_gib * GIB, 0)
            for job in shape.jobs
            if job.batch
        },
        overcommit=OvercommitConfig(margin=shape.lend_margin),
    )
    serving = shape.serving
    cluster.add_workload(
        SimWorkload(
            ref=serving.ref,
            kind="Deployment",
            role="serving",
            pod_requests=Resources(serving.cpu, serving.memory_gib * GIB, 0),
            replicas=serving.need(initial_demand_rps),
            priority=serving.priority,
            startup_delay_s=serving.startup_delay_s,
            min_replicas=serving.min_replicas,
            max_replicas=serving.max_replicas,
        )
    )
    for job in shape.jobs:
        cluster.add_workload(
            SimWorkload(
                ref=job.ref,
                kind="ElasticJob",
                role="training",
                # a batch trainer requests only the extended batch resources
                pod_requests=(
                    Resources()
                    if job.batch
                    else Resources(job.trainer_cpu, job.trainer_memory_gib * GIB, 0)
                ),
                replicas=job.min_trainers,
                priority=job.priority,
                startup_delay_s=job.startup_delay_s,
                min_replicas=0,
                max_replicas=job.max_trainers,
                gang_min=0 if job.batch else job.min_trainers,
                companion_count=job.pservers,
                companion_requests=Resources(job.pserver_cpu, job.pserver_memory_gib * GIB, 0),
            )
        )
    return cluster


class ClusterFigures(Protocol):
    """What the meter reads from a cluster (the sim, or a listing of a real one)."""

    def allocatable_total(self) -> Resources: ...

    def bound_requests_total(self) -> Resources: ...

    def ready_count(self, ref: WorkloadRef) -> int: ...

    def bound_count(self, ref: WorkloadRef) -> int: ...

    def bound_companions(self, ref: WorkloadRef) -> int: ...

    def job_running(self, ref: WorkloadRef) -> bool: ...

    def free_room(self) -> FloatArray: ...


class SimFigures:
    def __init__(self, cluster: SimCluster) -> None:
        self.cluster = cluster

    def allocatable_total(self) -> Resources:
        return self.cluster.allocatable_total()

    def bound_requests_total(self) -> Resources:
        return self.cluster.bound_requests_total()

    def ready_count(self, ref: WorkloadRef) -> int:
        return self.cluster.ready_count(ref)

    def bound_count(self, ref: WorkloadRef) -> int:
        return self.cluster.bound_count(ref)

    def bound_companions(self, ref: WorkloadRef) -> int:
        return self.cluster.workload(ref).bound_companions

    def job_running(self, ref: WorkloadRef) -> bool:
        return self.cluster.job_running(ref)

    def free_room(self) -> FloatArray:
        return self.cluster.free_room()


class ListedFigures:
    """Figures from a listing of nodes and pods (a real cluster through its ClusterPort)."""

    def __init__(
        self,
        nodes: Iterable[Node],
        pods: Iterable[Pod],
        *,
        gang_min: int = 1,
        running_is_ready: bool = False,
    ) -> None:
        self.nodes = [node for node in nodes if node.schedulable]
        # kwok's fake kubelets do not restore a pod's Ready condition after a node heartbeat
        # lapses (a busy machine): there, Running is the honest reading of "serving".
        self.running_is_ready = running_is_ready
        self.pods = [
            pod for pod in pods if pod.phase in ("Pending", "Running") and not pod.deleting
        ]
        self.gang_min = gang_min

    def allocatable_total(self) -> Resources:
        total = Resources()
        for node in self.nodes:
            total = total + node.allocatable
        return total

    def bound_requests_total(self) -> Resources:
        total = Resources()
        for pod in self.pods:
            if pod.node is not None:
                total = total + pod.requests
        return total

    def _owned(self, ref: WorkloadRef) -> list[Pod]:
        return [pod for pod in self.pods if pod.owner == ref]

    def is_ready(self, pod: Pod) -> bool:
        if self.running_is_ready:
            return pod.phase == "Running" and pod.node is not None
        return pod.ready

    def ready_count(self, ref: WorkloadRef) -> int:
        return sum(1 for pod in self._owned(ref) if self.is_ready(pod) and not pod.companion)

    def bound_count(self, ref: WorkloadRef) -> int:
        return sum(1 for pod in self._owned(ref) if pod.node is not None and not pod.companion)

    def bound_companions(self, ref: WorkloadRef) -> int:
        return sum(1 for pod in self._owned(ref) if pod.node is not None and pod.companion)

    def job_running(self, ref: WorkloadRef) -> bool:
        return self.ready_count(ref) >= self.gang_min

    def free_room(self) -> FloatArray:
        row = {node.name: i for i, node in enumerate(self.nodes)}
        free = np.array(
            [
                (n.allocatable.cpu, n.allocatable.memory, float(n.allocatable.gpu))
                for n in self.nodes
            ]
        ).reshape(-1, 3)
        for pod in self.pods:
            if pod.node in row:
                free[row[pod.node]] -= (pod.requests.cpu, pod.requests.memory, pod.requests.gpu)
        return free


@dataclass
class _JobMeter:
    started_at: float | None = None
    work: float = 0.0
    paused_until: float = -math.inf
    last_ready: int = 0


@dataclass
class Meter:
    """Integrates the run's figures over simulated time; samples series for the plot.

    The cluster figures (utilisation, cpu used and lent, stranded, shortfall, starved minutes,
    training's share of spare) go through `tideshift simulate`'s accountant
    (`simulator/accounting.py`), so the two tables mean the same. Training work is modelled as
    in `simulate`: ready_trainers ** speedup_exponent per second while the job runs, none for
    `restart_cost_s` after its trainer set changes.
    """

    shape: WorldShape
    start: float  # simulated time the run starts (Unix seconds)
    sample_every_s: float = 300.0
    last: float | None = None
    accounts: Accountant = field(init=False)
    jobs: dict[str, _JobMeter] = field(default_factory=dict)
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
            self.series["t"].append(now - self.start)
            self.series["demand"].append(demand_rps)
            self.series["capacity"].append(capacity)
            self.series["replicas"].append(ready)
            self.series["util_cpu"].append(bound.cpu / allocatable.cpu if allocatable.cpu else 0.0)
            for job in self.shape.jobs:
                self.series["trainers"].setdefault(job.name, []).append(
                    cluster.ready_count(job.ref)
                )
            for name in ("serving_used", "serving_idle", "training", "lent"):
                self.series[f"cores_{name}"].append(cores[name])
            self.series["cores_free"].append(
                max(allocatable.cpu - bound.cpu - max(lent_cpu - cores["serving_idle_all"], 0), 0)
            )
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
            trainers = cluster.ready_count(job.ref)
            meter = self.jobs.get(job.name)
            if meter is None:  # first sight: the job's current trainer set is no restart
                meter = self.jobs[job.name] = _JobMeter(last_ready=trainers)
            if trainers != meter.last_ready:
                # The change happened somewhere in [begin, now): count it from the start.
                meter.paused_until = begin + self.shape.restart_cost_s
                meter.last_ready = trainers
            if cluster.job_running(job.ref):
                if meter.started_at is None:
                    meter.started_at = begin
                productive = now - max(begin, meter.paused_until)
                if productive > 0:
                    meter.work += trainers**self.shape.speedup_exponent * productive
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
            if start_h <= (t / 3600.0) % 24 < end_h
        ]
        return sum(values) / len(values) if values else None
