"""The demo's world: the shape of its cluster, serving workload and elastic jobs, and that
world built on the simulated cluster `simulate` uses too (`simulator/lending.py`). Decides
sizes only; no clock, no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from tideshift.events.models import ServingPolicy
from tideshift.services.cluster.core.overcommit import OvercommitConfig
from tideshift.services.cluster.port import Node, Resources, WorkloadRef
from tideshift.services.cluster.sim import SimWorkload
from tideshift.services.simulator.core.training import WorkModel
from tideshift.services.simulator.lending import LendingCluster
from tideshift.services.simulator.scenario import SIMULATED_TARGET_UTILIZATION
from tideshift.services.simulator.world import replicas_needed

GIB = float(2**30)
SERVING_KIND = "Deployment"
JOB_KIND = "ElasticJob"


@dataclass(frozen=True)
class ServingShape:
    """The serving workload; `capacity_rps` is one replica at 100 % (the sample app's), run
    at `simulate`'s target utilisation. `policy()` is its workload spec."""

    name: str = "web"
    namespace: str = "demo"
    cpu: float = 1.0
    memory_gib: float = 2.0
    capacity_rps: float = 50.0
    target_utilization: float = SIMULATED_TARGET_UTILIZATION
    min_replicas: int = 4
    max_replicas: int = 400
    startup_delay_s: float = 60.0
    priority: int = 1000

    @property
    def ref(self) -> WorkloadRef:
        return WorkloadRef(self.namespace, SERVING_KIND, self.name)

    def need(self, rps: float) -> int:
        """Replicas the demand needs at the target utilisation (what `simulate` measures)."""
        bounds = (self.min_replicas, self.max_replicas)
        return replicas_needed(rps, self.capacity_rps, self.target_utilization, bounds)

    def policy(self, *, margin_s: float, stabilization_s: float) -> ServingPolicy:
        """Its workload spec: capacity per replica at the target utilisation (where a replica
        uses that fraction of its cpu, the rest may be lent), its start-up as lead time."""
        return ServingPolicy(
            capacity_rps=self.capacity_rps * self.target_utilization,
            min_replicas=self.min_replicas,
            max_replicas=self.max_replicas,
            lead_time_seconds=self.startup_delay_s,
            margin_seconds=margin_s,
            stabilization_seconds=stabilization_s,
            target_utilization=self.target_utilization,
        )


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
    # reserves but does not use (`simulator/lending.py`), not on requests.
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
    work: WorkModel = field(default_factory=WorkModel)  # as in `simulate`


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
