"""Batch trainers of the simulated cluster: pods that request tideshift.io/batch-cpu and
batch-memory, not cpu / memory, so the simulated scheduler never sees them. Here they bind per
node against the room the planner lends: serving's idle reservation (its requests minus what
it uses), within reclaimable capacity (`cluster.overcommit`: allocatable x (1 - margin) - what
non-batch pods use); they shrink where their nodes are shortest of it, and are evicted first
from any node where what everything uses would exceed allocatable."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from tideshift.services.cluster.overcommit import OvercommitConfig, lendable
from tideshift.services.cluster.port import WorkloadRef
from tideshift.services.planner import policy as pol


@dataclass
class _BatchPod:
    node: int
    ready_at: float


@dataclass
class BatchJob:
    request: pol.FloatArray  # (cpu, memory, gpu) one trainer uses
    startup_delay_s: float
    desired: int = 0
    pods: list[_BatchPod] = field(default_factory=list)  # in binding order


class BatchTrainers:
    """Every batch job's trainers on the nodes (rows of `allocatable`)."""

    def __init__(self, node_names: list[str], allocatable: pol.FloatArray) -> None:
        self.node_names = node_names
        self.allocatable = allocatable
        self.config = OvercommitConfig()
        self.jobs: dict[WorkloadRef, BatchJob] = {}
        self.started = 0
        self.stopped = 0
        self.evicted = 0

    def add(self, ref: WorkloadRef, request: pol.Vector, startup_delay_s: float) -> None:
        self.jobs[ref] = BatchJob(np.asarray(request, dtype=np.float64), startup_delay_s)

    def remove(self, ref: WorkloadRef) -> None:
        del self.jobs[ref]

    def scale(self, ref: WorkloadRef, desired: int) -> None:
        self.jobs[ref].desired = desired

    def use(self) -> pol.FloatArray:
        """What batch trainers use per node (nodes, 3): their whole vector, bound or starting."""
        use = np.zeros_like(self.allocatable)
        for job in self.jobs.values():
            for pod in job.pods:
                use[pod.node] += job.request
        return use

    def bound(self, ref: WorkloadRef) -> int:
        return len(self.jobs[ref].pods)

    def ready(self, ref: WorkloadRef, now: float) -> int:
        return sum(1 for pod in self.jobs[ref].pods if pod.ready_at <= now + 1e-9)

    def pod_specs(self) -> list[pol.PodSpec]:
        """The trainers as the API shows them: no cpu / memory / GPU requests."""
        return [
            pol.PodSpec((0.0, 0.0, 0.0), self.node_names[pod.node], ref)
            for ref, job in self.jobs.items()
            for pod in job.pods
        ]

    def evict(self, non_batch_used: pol.FloatArray) -> None:
        """Off every node where non-batch usage plus the trainers exceeds allocatable, each
        job's latest trainers there leave until the rest fits."""
        over = np.any(
            non_batch_used[:, :2] + self.use()[:, :2] > self.allocatable[:, :2] + 1e-6, axis=1
        )
        for node in np.flatnonzero(over).tolist():
            on_node = [
                (index, ref)
                for ref, job in self.jobs.items()
                for index, pod in enumerate(job.pods)
                if pod.node == node
            ]
            room = self.allocatable[node, :2] - non_batch_used[node, :2]
            room -= sum((self.jobs[ref].request[:2] for _, ref in on_node), np.zeros(2))
            for index, ref in sorted(on_node, reverse=True):
                if np.all(room >= -1e-6):
                    break
                job = self.jobs[ref]
                job.pods.pop(index)
                room += job.request[:2]
                self.evicted += 1
                self.stopped += 1

    def room(self, non_batch_used: pol.FloatArray, serving_idle: pol.FloatArray) -> pol.FloatArray:
        """Per node (cpu, memory) batch trainers may use: serving's idle reservation within
        what is reclaimable."""
        return lendable(self.allocatable, non_batch_used, serving_idle, self.config)

    def shrink(self, non_batch_used: pol.FloatArray, serving_idle: pol.FloatArray) -> None:
        """Jobs above their desired count lose trainers where the node is most short of
        room (the executor's deletion cost), latest bound first on a tie."""
        short = self.use()[:, :2] - self.room(non_batch_used, serving_idle)
        for job in self.jobs.values():
            while len(job.pods) > job.desired:
                ranks = [
                    (float(short[pod.node].max()), index) for index, pod in enumerate(job.pods)
                ]
                _, index = max(ranks)
                pod = job.pods.pop(index)
                short[pod.node] -= job.request[:2]
                self.stopped += 1

    def grow(
        self, non_batch_used: pol.FloatArray, serving_idle: pol.FloatArray, now: float
    ) -> None:
        """Jobs below their desired count bind new trainers on the room left, packed as the
        scheduler packs."""
        free = np.zeros_like(self.allocatable)
        free[:, :2] = self.room(non_batch_used, serving_idle)
        free -= self.use()
        for job in self.jobs.values():
            wanted = job.desired - len(job.pods)
            if wanted <= 0:
                continue
            nodes, counts = pol.pack_sparse(free, job.request, wanted, self.allocatable)
            for node, count in zip(nodes.tolist(), counts.tolist(), strict=True):
                free[node] -= count * job.request
                job.pods += [_BatchPod(node, now + job.startup_delay_s) for _ in range(count)]
                self.started += count
