"""The simulated cluster with serving's idle reservation lent to batch trainers: one model for
`tideshift simulate` and `tideshift demo`. It decides where batch trainers bind and when they
are evicted, and whether serving was starved; it imports no clock, bus or Kubernetes.

A job marked batch has trainers that request `tideshift.io/batch-cpu` / `batch-memory`, not
cpu / memory, so the simulated scheduler sees them as empty pods. `LendingCluster` places them
per node on what the executor advertises and the planner lends (`cluster.overcommit.lendable`:
the idle part of what non-batch pods request, within allocatable x (1 - margin) - what they
use). A ready serving pod uses its request x how busy demand keeps serving; a serving pod
still starting, and every other pod, uses its requests. Room no request holds is not lent. A
pod with requests that binds where batch trainers borrow takes its cores at once (they run
BestEffort, with the smallest cpu share): the trainers that no longer fit there are evicted on
binding. When serving's usage rises, batch trainers are evicted first from the nodes short of
reclaimable room; a node where what everything uses would exceed allocatable is a minute
serving was starved (measured before that eviction). A batch job scaled down loses its
trainers where room is shortest (the executor's deletion cost).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import numpy as np

from tideshift.services.cluster.core.overcommit import OvercommitConfig, lendable, reclaimable
from tideshift.services.cluster.core.placement import FloatArray
from tideshift.services.cluster.port import Node, Resources, WorkloadRef
from tideshift.services.cluster.sim import SimCluster, SimWorkload
from tideshift.services.cluster.sim.objects import SimNode, SimPod
from tideshift.services.core.constants import EPS


class LendingCluster(SimCluster):
    """The sim cluster plus batch trainers bound on serving's idle reservation."""

    def __init__(
        self,
        nodes: Iterable[Node],
        *,
        now: float,
        batch_use: Mapping[WorkloadRef, Resources],
        overcommit: OvercommitConfig,
    ) -> None:
        super().__init__(nodes, now=now)
        self.batch_use = dict(batch_use)  # what one trainer of each batch job uses
        self.overcommit = overcommit
        # Fraction of its requests each serving workload uses; set every step by `step_serving`.
        self.serving_busy: dict[WorkloadRef, float] = {}
        self.batch_evictions = 0

    def add_batch_workload(self, workload: SimWorkload, trainer_use: Resources) -> None:
        """A batch job whose trainers (requesting nothing) each use `trainer_use`."""
        self.batch_use[workload.ref] = trainer_use
        self.add_workload(workload)

    def step_serving(self, now: float, demand: Mapping[WorkloadRef, tuple[float, float]]) -> bool:
        """Step to `now` with each serving workload (ref -> (req/s, one replica's capacity
        req/s)) as busy as its demand keeps its ready replicas; then batch trainers make way
        where reclaimable room fell short. Returns whether serving was starved, measured
        before they made way: a rise in usage they still stood in the way of counts."""
        for ref, (rps, capacity_rps) in demand.items():
            self.serving_busy[ref] = serving_busy(rps, self.ready_count(ref) * capacity_rps)
        self.step(now)
        if not self.batch_use:  # nothing lent: every pod holds what it uses, nothing to evict
            return False
        starved = self.starved()
        self.evict_over_reclaimable()
        return starved

    def _batch_trainer(self, pod: SimPod) -> bool:
        return pod.owner in self.batch_use and not pod.companion

    def usage(self) -> tuple[list[str], FloatArray, FloatArray, FloatArray, FloatArray]:
        """(node names, allocatable, non-batch use, non-batch idle reservation, batch use),
        each per node (nodes, 3)."""
        names = [name for name, sim_node in self._nodes.items() if sim_node.node.schedulable]
        row = {name: i for i, name in enumerate(names)}
        allocatable = np.array(
            [resource_array(self._nodes[name].node.allocatable) for name in names]
        ).reshape(-1, 3)
        non_batch = np.zeros_like(allocatable)
        idle = np.zeros_like(allocatable)
        batch = np.zeros_like(allocatable)
        for pod in self.pods_raw():
            if pod.node not in row:
                continue
            if self._batch_trainer(pod):
                batch[row[pod.node]] += resource_array(self.batch_use[pod.owner])
                continue
            requests = resource_array(pod.requests)
            busy = (
                self.serving_busy.get(pod.owner, 1.0)
                if pod.role == "serving" and pod.ready
                else 1.0
            )
            non_batch[row[pod.node]] += busy * requests
            idle[row[pod.node]] += (1.0 - busy) * requests
        return names, allocatable, non_batch, idle, batch

    def lent_cpu(self) -> float:
        """Cores batch trainers use (bound, starting or ready)."""
        return float(self.usage()[4][:, 0].sum())

    def starved(self) -> bool:
        """Some node's usage exceeds its allocatable cpu: serving cannot get what it uses."""
        _, allocatable, non_batch, _, batch = self.usage()
        return bool(np.any(non_batch[:, 0] + batch[:, 0] > allocatable[:, 0] + 1e-6))

    def evict_over_reclaimable(self, only: str | None = None) -> int:
        """Evict the newest batch trainers from nodes (or node `only`) where they use more
        than is reclaimable; their pods come back pending and bind where there is room."""
        names, allocatable, non_batch, _, batch = self.usage()
        room = reclaimable(allocatable, non_batch, self.overcommit)
        evicted = 0
        for i, name in enumerate(names):
            over = batch[i, :2] - room[i]
            if (only is not None and name != only) or np.all(over <= 1e-6):
                continue
            pods = sorted(
                (pod for pod in self._nodes[name].pods.values() if self._batch_trainer(pod)),
                key=lambda pod: -pod.seq,
            )
            for pod in pods:
                if np.all(over <= 1e-6):
                    break
                over -= resource_array(self.batch_use[pod.owner])[:2]
                self._delete_pod(pod, evicted=True)
                evicted += 1
        self.batch_evictions += evicted
        return evicted

    def _bind(self, pod: SimPod, sim_node: SimNode) -> None:
        super()._bind(pod, sim_node)
        if self.batch_use and not self._batch_trainer(pod) and pod.requests.cpu > 0:
            self.evict_over_reclaimable(only=sim_node.node.name)

    def step(self, now: float) -> None:
        # Reclaimable room changes with demand, not only with pod events: retry pending
        # batch trainers every step.
        if any(self._batch_trainer(self._pods[key]) for key in self._pending):
            self._schedule_needed = True
        super().step(now)

    def _room(self) -> tuple[list[str], FloatArray]:
        """(node names, per node the (cpu, memory) lent and not yet borrowed: negative where
        batch trainers hold more than is lent)."""
        names, allocatable, non_batch, idle, batch = self.usage()
        return names, lendable(allocatable, non_batch, idle, self.overcommit) - batch[:, :2]

    def _place(self, pod: SimPod) -> bool:
        if not self._batch_trainer(pod):
            return super()._place(pod)
        names, room = self._room()
        need = resource_array(self.batch_use[pod.owner])[:2]
        # relative tolerance: memory is in bytes, where float sums drift by far more than EPS
        fits = np.all(room >= need * (1.0 - EPS), axis=1)
        if not np.any(fits):
            return False
        # Best fit: the node with the least cpu room that fits keeps larger gaps whole.
        candidates = np.flatnonzero(fits)
        chosen = candidates[int(np.argmin(room[candidates, 0]))]
        self._bind(pod, self._nodes[names[chosen]])
        return True

    def _reconcile_workload(self, workload: SimWorkload) -> None:
        trainers = [pod for pod in workload.pods if self._batch_trainer(pod)]
        extra = len(trainers) - workload.replicas
        if extra <= 0 or workload.ref not in self.batch_use:
            super()._reconcile_workload(workload)
            return
        # A batch job scaled down loses its trainers where lent room is shortest (pending
        # ones first, the newest first on a tie), as the executor's deletion cost orders them.
        names, room = self._room()
        short = {name: float(-room[i, 0]) for i, name in enumerate(names)}
        victims = sorted(
            trainers,
            key=lambda pod: (pod.node is not None, -short.get(pod.node or "", 0.0), -pod.seq),
        )
        for pod in victims[:extra]:
            self._delete_pod(pod, evicted=False)

    def _preempt_for(self, pod: SimPod) -> bool:
        # Batch trainers are below everything: they never preempt.
        return False if self._batch_trainer(pod) else super()._preempt_for(pod)


def serving_busy(demand_rps: float, ready_capacity_rps: float) -> float:
    """Fraction of its requests a ready serving replica uses: demand over ready capacity,
    never above 1 (none when nothing is ready)."""
    return min(1.0, demand_rps / ready_capacity_rps) if ready_capacity_rps > 0 else 0.0


def resource_array(resources: Resources) -> FloatArray:
    return np.array(resources.vector(), dtype=np.float64)
