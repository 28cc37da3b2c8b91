"""An in-process cluster driven by explicit time: nodes, pods, a scheduler, workload controllers.

`SimCluster.step(now)` advances the cluster to `now`: workload controllers create or delete
pods to match each workload's desired replicas, the scheduler binds pending pods (the packing
model of `cluster.core.placement`, gang minimums for elastic jobs, priority preemption) and bound
pods become ready after their start-up delay. Nothing happens between steps, so a simulated
day costs only as many steps as the caller takes. The async `ClusterPort` methods wrap the
synchronous ones.

Modelled after Kubernetes where it matters to a capacity planner:
* A Deployment's scale-down deletes unbound pods first, then not-ready ones, then pods on the
  node that stays emptiest without that Deployment's pods (the order the executor's
  pod-deletion-cost annotations give the ReplicaSet controller), fewest there first.
* An elastic job (Volcano / PyTorchJob-like) has fixed companion pods (parameter servers) and
  a trainer count; its pods bind only while at least `gang_min` trainers can bind with them.
* Preemption evicts the lowest-priority, newest pods on the one node where that frees enough
  room; evicted pods are deleted and their controller recreates them (pending).
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable, Iterable
from typing import Literal

import numpy as np

from tideshift.services.cluster.core.placement import best_node, entry_rest
from tideshift.services.cluster.port import (
    ClusterChange,
    Node,
    Pod,
    Resources,
    ScaleState,
    WorkloadRef,
)
from tideshift.services.cluster.sim.objects import (
    SimCounters,
    SimNode,
    SimPod,
    SimWorkload,
    as_list,
    fits_in,
)
from tideshift.services.core.constants import EPS


class SimCluster:
    """The simulated cluster. Not thread-safe; drive it from one task."""

    def __init__(self, nodes: Iterable[Node] = (), *, now: float = 0.0) -> None:
        self.now = now
        self.counters = SimCounters()
        self._nodes: dict[str, SimNode] = {}
        self._workloads: dict[WorkloadRef, SimWorkload] = {}
        self._pods: dict[str, SimPod] = {}  # key namespace/name
        self._pending: set[str] = set()
        self._starting: list[tuple[float, int, str]] = []  # (ready_at, seq, pod key) heap
        self._seq = itertools.count()
        # An insertion-ordered set (dict keys): reconciling in hash order would create pods in
        # an order that changes with PYTHONHASHSEED, and so would every simulated figure.
        self._dirty_workloads: dict[WorkloadRef, None] = {}
        self._schedule_needed = False
        self._subscribers: list[Callable[[ClusterChange], None]] = []
        self._bound_total = [0.0, 0.0, 0.0]
        for node in nodes:
            self.add_node(node)

    # ---- nodes -----------------------------------------------------------------------------

    def add_node(self, node: Node) -> None:
        if node.name in self._nodes:
            raise ValueError(f"node {node.name!r} already exists")
        self._nodes[node.name] = SimNode(node, as_list(node.allocatable))
        self._schedule_needed = True
        self._emit("added", node)

    def remove_node(self, name: str) -> None:
        sim_node = self._nodes.pop(name)
        for pod in list(sim_node.pods.values()):
            self._delete_pod(pod, evicted=True)
        self._emit("deleted", sim_node.node)

    def nodes(self) -> list[Node]:
        return [sim_node.node for sim_node in self._nodes.values()]

    def allocatable_total(self) -> Resources:
        total = Resources()
        for sim_node in self._nodes.values():
            if sim_node.node.schedulable:
                total = total + sim_node.node.allocatable
        return total

    def free_room(self) -> np.ndarray:
        """Free (cpu, memory, GPU) per schedulable node, (nodes, 3)."""
        return np.array(
            [sim_node.free for sim_node in self._nodes.values() if sim_node.node.schedulable],
            dtype=np.float64,
        ).reshape(-1, 3)

    def bound_requests_total(self) -> Resources:
        """Requests of every pod bound to a node (starting or ready)."""
        cpu, memory, gpu = self._bound_total
        return Resources(cpu, memory, round(gpu))

    # ---- workloads ------------------------------------------------------------------------

    def add_workload(self, workload: SimWorkload) -> None:
        if workload.ref in self._workloads:
            raise ValueError(f"workload {workload.ref} already exists")
        workload.replicas = workload.clamp(workload.replicas)
        self._workloads[workload.ref] = workload
        self._dirty_workloads[workload.ref] = None

    def delete_workload(self, ref: WorkloadRef) -> None:
        workload = self._workloads.pop(ref)
        for pod in list(workload.pods):
            self._delete_pod(pod, evicted=False, count_stop=False)
        self._dirty_workloads.pop(ref, None)

    def workload(self, ref: WorkloadRef) -> SimWorkload:
        return self._workloads[ref]

    def workloads(self) -> list[SimWorkload]:
        return list(self._workloads.values())

    def scale_state(self, ref: WorkloadRef) -> ScaleState:
        workload = self._workloads[ref]
        return ScaleState(
            target=ref,
            replicas=workload.replicas,
            ready_replicas=self.ready_count(ref),
            min_replicas=workload.min_replicas,
            max_replicas=workload.max_replicas,
            role=workload.role,
        )

    def scale(self, ref: WorkloadRef, replicas: int) -> ScaleState:
        workload = self._workloads[ref]
        clamped = workload.clamp(replicas)
        if clamped != workload.replicas:
            workload.replicas = clamped
            self._dirty_workloads[ref] = None
        return self.scale_state(ref)

    def ready_count(self, ref: WorkloadRef) -> int:
        """Ready pods that do the workload's work (trainers for jobs, replicas otherwise)."""
        return self._workloads[ref].ready_workers

    def bound_count(self, ref: WorkloadRef) -> int:
        return self._workloads[ref].bound_workers

    def job_running(self, ref: WorkloadRef) -> bool:
        """An elastic job runs when its companions and at least `gang_min` trainers are ready."""
        workload = self._workloads[ref]
        return workload.ready_companions >= workload.companion_count and (
            workload.ready_workers >= max(workload.gang_min, 1)
        )

    # ---- pods ------------------------------------------------------------------------------

    def pods(self) -> list[Pod]:
        return [pod.snapshot() for pod in self._pods.values()]

    def pods_raw(self) -> Iterable[SimPod]:
        """The live pod records (read-only use: the simulator converts them in bulk)."""
        return self._pods.values()

    def _create_pod(self, workload: SimWorkload, *, companion: bool) -> None:
        seq = next(self._seq)
        prefix = "ps" if companion else ("t" if workload.kind == "ElasticJob" else "r")
        pod = SimPod(
            namespace=workload.ref.namespace,
            name=f"{workload.ref.name}-{prefix}{seq}",
            requests=workload.companion_requests if companion else workload.pod_requests,
            # Companions outrank their own trainers so preemption takes trainers first.
            priority=workload.priority + (1 if companion else 0),
            owner=workload.ref,
            role=workload.role,
            companion=companion,
            created_at=self.now,
            seq=seq,
        )
        workload.pods.append(pod)
        self._pods[pod.namespace + "/" + pod.name] = pod
        self._pending.add(pod.namespace + "/" + pod.name)
        self._schedule_needed = True
        self._emit("added", pod)

    def _delete_pod(self, pod: SimPod, *, evicted: bool, count_stop: bool = True) -> None:
        key = pod.namespace + "/" + pod.name
        self._pods.pop(key, None)
        self._pending.discard(key)
        workload = self._workloads.get(pod.owner)
        if workload is not None:
            workload.pods.remove(pod)
            workload._count(
                pod, bound=-1 if pod.node is not None else 0, ready=-1 if pod.ready else 0
            )
            if evicted:
                self._dirty_workloads[pod.owner] = None
        if pod.node is not None:
            sim_node = self._nodes.get(pod.node)
            if sim_node is not None:
                del sim_node.pods[key]
                self._release(sim_node, pod.requests)
            if count_stop:
                stops = self.counters.pods_stopped
                stops[pod.counter_key] = stops.get(pod.counter_key, 0) + 1
        self._schedule_needed = True
        self._emit("deleted", pod)

    def _bind(self, pod: SimPod, sim_node: SimNode) -> None:
        key = pod.namespace + "/" + pod.name
        pod.node = sim_node.node.name
        pod.bound_at = self.now
        sim_node.pods[key] = pod
        request = pod.requests
        sim_node.free[0] -= request.cpu
        sim_node.free[1] -= request.memory
        sim_node.free[2] -= request.gpu
        self._bound_total[0] += request.cpu
        self._bound_total[1] += request.memory
        self._bound_total[2] += request.gpu
        self._pending.discard(key)
        workload = self._workloads[pod.owner]
        workload._count(pod, bound=1)
        heapq.heappush(self._starting, (self.now + workload.startup_delay_s, pod.seq, key))
        bound = self.counters.pods_bound
        bound[pod.counter_key] = bound.get(pod.counter_key, 0) + 1
        self._emit("modified", pod)

    def _release(self, sim_node: SimNode, request: Resources) -> None:
        sim_node.free[0] += request.cpu
        sim_node.free[1] += request.memory
        sim_node.free[2] += request.gpu
        self._bound_total[0] -= request.cpu
        self._bound_total[1] -= request.memory
        self._bound_total[2] -= request.gpu

    # ---- time ------------------------------------------------------------------------------

    def step(self, now: float) -> None:
        """Advance to `now`: reconcile workloads, schedule, and mark started pods ready."""
        if now < self.now:
            raise ValueError(f"time runs forward: now={now} < cluster time {self.now}")
        self.now = now
        self._reconcile()
        if self._schedule_needed:
            self._schedule()
        while self._starting and self._starting[0][0] <= now + EPS:
            _, _, key = heapq.heappop(self._starting)
            pod = self._pods.get(key)
            if pod is not None and pod.node is not None and not pod.ready:
                pod.ready = True
                self._workloads[pod.owner]._count(pod, ready=1)
                self._emit("modified", pod)

    def advance(self, seconds: float) -> None:
        self.step(self.now + seconds)

    def _reconcile(self) -> None:
        # Evictions mark workloads dirty while we iterate: loop until quiet.
        while self._dirty_workloads:
            ref = next(iter(self._dirty_workloads))
            del self._dirty_workloads[ref]
            workload = self._workloads.get(ref)
            if workload is not None:
                self._reconcile_workload(workload)

    def _reconcile_workload(self, workload: SimWorkload) -> None:
        companions = [pod for pod in workload.pods if pod.companion]
        for _ in range(workload.companion_count - len(companions)):
            self._create_pod(workload, companion=True)
        workers = [pod for pod in workload.pods if not pod.companion]
        missing = workload.replicas - len(workers)
        for _ in range(missing):
            self._create_pod(workload, companion=False)
        if missing < 0:
            per_node: dict[str | None, int] = {}
            for pod in workers:
                per_node[pod.node] = per_node.get(pod.node, 0) + 1
            rest = self._removal_keys(workload, per_node)

            def deletion_rank(pod: SimPod) -> tuple[int, int, float, int, int]:
                # the executor's pod-deletion-cost order: pods without GPUs off GPU nodes, then
                # pods whose node then stays emptiest
                return (
                    0 if pod.node is None else 1,
                    0 if not pod.ready else 1,
                    rest.get(pod.node, 0.0),
                    per_node[pod.node],
                    -pod.seq,
                )

            for pod in sorted(workers, key=deletion_rank)[:-missing]:
                self._delete_pod(pod, evicted=False)

    def _removal_keys(
        self, workload: SimWorkload, per_node: dict[str | None, int]
    ) -> dict[str | None, float]:
        """`placement.removal_key` of each node holding the workload's pods."""
        names = [name for name in per_node if name is not None]
        if not names:
            return {}
        request = np.array(as_list(workload.pod_requests))
        allocatable = np.array([as_list(self._nodes[name].node.allocatable) for name in names])
        used = allocatable - np.array([self._nodes[name].free for name in names])
        counts = np.array([per_node[name] for name in names], dtype=np.int64)
        keys = entry_rest(used, allocatable, np.arange(len(names)), counts, request)
        return dict(zip(names, keys.tolist(), strict=True))

    # ---- scheduling ------------------------------------------------------------------------

    def _schedule(self) -> None:
        self._schedule_needed = False
        if not self._pending:
            return
        pending = sorted(
            (self._pods[key] for key in self._pending),
            key=lambda pod: (-pod.priority, pod.seq),
        )
        # A request shape that failed at some priority fails for every later pod with the same
        # shape and no higher priority: the failure cache keeps scheduling cheap.
        failed: set[tuple[Resources, int]] = set()
        gang_done: set[WorkloadRef] = set()
        for pod in pending:
            if pod.node is not None or (pod.namespace + "/" + pod.name) not in self._pods:
                continue
            workload = self._workloads[pod.owner]
            if workload.kind == "ElasticJob" and self._needs_gang(workload):
                if workload.ref not in gang_done:
                    gang_done.add(workload.ref)
                    self._schedule_gang(workload)
                continue
            if (pod.requests, pod.priority) in failed:
                continue
            if not self._place(pod) and not self._preempt_for(pod):
                failed.add((pod.requests, pod.priority))

    def _needs_gang(self, workload: SimWorkload) -> bool:
        return workload.bound_workers < workload.gang_min

    def _schedule_gang(self, workload: SimWorkload) -> None:
        """Bind unbound companions plus enough trainers to reach the gang minimum, or none."""
        bound_trainers = workload.bound_workers
        unbound_companions = [pod for pod in workload.pods if pod.companion and pod.node is None]
        unbound_trainers = [pod for pod in workload.pods if not pod.companion and pod.node is None]
        needed = workload.gang_min - bound_trainers
        if needed > len(unbound_trainers):
            return  # the controller has not created enough trainers (replicas < gang_min)
        group = unbound_companions + sorted(unbound_trainers, key=lambda pod: pod.seq)[:needed]
        free = {name: list(sim_node.free) for name, sim_node in self._nodes.items()}
        plan: list[tuple[SimPod, str]] = []
        for pod in group:
            name = self._best_node(pod.requests, free)
            if name is None:
                return  # all or nothing; gangs do not preempt (as in kube-batch's default)
            slot = free[name]
            slot[0] -= pod.requests.cpu
            slot[1] -= pod.requests.memory
            slot[2] -= pod.requests.gpu
            plan.append((pod, name))
        for pod, name in plan:
            self._bind(pod, self._nodes[name])
        # Trainers beyond the gang minimum are ordinary pods now.
        for pod in unbound_trainers:
            if pod.node is None:
                self._place(pod)

    def _best_node(
        self, request: Resources, free: dict[str, list[float]] | None = None
    ) -> str | None:
        """The node `cluster.core.placement` picks (the packing scheduler profile's model)."""
        names = [name for name, sim_node in self._nodes.items() if sim_node.node.schedulable]
        if not names:
            return None
        free_rows = np.array(
            [self._nodes[name].free if free is None else free[name] for name in names]
        )
        allocatable = np.array([as_list(self._nodes[name].node.allocatable) for name in names])
        row = best_node(free_rows, allocatable, np.array(as_list(request)))
        return None if row is None else names[row]

    def _place(self, pod: SimPod) -> bool:
        name = self._best_node(pod.requests)
        if name is None:
            return False
        self._bind(pod, self._nodes[name])
        return True

    def _preempt_for(self, pod: SimPod) -> bool:
        """Evict lower-priority pods on the node where the fewest evictions make room."""
        best: tuple[int, str, list[SimPod]] | None = None
        for name, sim_node in self._nodes.items():
            if not sim_node.node.schedulable:
                continue
            victims_pool = sorted(
                (other for other in sim_node.pods.values() if other.priority < pod.priority),
                key=lambda other: (other.priority, -other.seq),
            )
            if not victims_pool:
                continue
            free = list(sim_node.free)
            victims: list[SimPod] = []
            for victim in victims_pool:
                if fits_in(pod.requests, free):
                    break
                victims.append(victim)
                free[0] += victim.requests.cpu
                free[1] += victim.requests.memory
                free[2] += victim.requests.gpu
            if not fits_in(pod.requests, free):
                continue
            if best is None or len(victims) < best[0]:
                best = (len(victims), name, victims)
        if best is None:
            return False
        _, name, victims = best
        for victim in victims:
            self.counters.preemptions += 1
            self._delete_pod(victim, evicted=True)
        self._bind(pod, self._nodes[name])
        return True

    # ---- watch plumbing --------------------------------------------------------------------

    def subscribe(self, callback: Callable[[ClusterChange], None]) -> Callable[[], None]:
        self._subscribers.append(callback)
        return lambda: self._subscribers.remove(callback)

    def _emit(self, change_type: Literal["added", "modified", "deleted"], obj: object) -> None:
        if not self._subscribers:
            return  # building snapshots is the costly part of a big simulation: skip if unheard
        snapshot = obj.snapshot() if isinstance(obj, SimPod) else obj
        assert isinstance(snapshot, Node | Pod)
        change = ClusterChange(change_type, snapshot)
        for callback in list(self._subscribers):
            callback(change)
