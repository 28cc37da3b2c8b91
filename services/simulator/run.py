"""One policy replayed on the simulated cluster on the simulated cluster, in simulated time.

Each policy gets a fresh `SimCluster` and the same scenario (see `scenario.py` for the
format). Every `step_s` the loop: admits arriving jobs, lets the policy plan when its cadence is
due (Tideshift every `plan_interval_s`; the baselines plan every step and keep their own
sync periods), applies changed counts to the cluster, steps the cluster, and integrates the
metrics over the step (`accounting.py`, the accountant the demo shares):

* utilisation: requests of bound pods / allocatable, per resource, time-averaged;
* cpu used: what pods use / allocatable, from a usage model: a serving pod uses
  demand / ready capacity x its request (never above it), every other pod its request; batch
  trainers (jobs with `batch: true`, Tideshift only; `batch.py`) request nothing, bind on
  serving's idle reservation within the reclaimable capacity and use their whole trainer
  vector (`cpu_batch` is their share);
* stranded capacity: free cpu and GPUs on nodes where not one trainer of a job that wants more
  fits (`policy.stranded_capacity`), as a fraction of allocatable, time-averaged;
* serving starved minutes: minutes in which some node's pods held more requests than its
  allocatable, or what its pods use (batch trainers included, measured before they are
  evicted) exceeded its allocatable, so serving could not get what its demand needed (must
  stay 0);
* serving shortfall: request-seconds above ready replicas x `capacity_rps`; minutes with any;
* training work: progress units, ready_trainers ** speedup_exponent per second while the job
  runs (gang and parameter servers ready), none for `restart_cost_s` after its trainer set
  changes; jobs with `work` finish and leave;
* job pending time: arrival until the job first runs (jobs that never run count until the end);
* trainer churn: trainer pods started plus trainer pods stopped while their job went on;
* training share of spare: training requests / (allocatable - what serving needs at target
  utilisation for the actual demand - other pods), cpu, time-integrated.

Forecasts: `oracle` reads the true future demand; `model` fits the predictor's registry model
(default `tidal`) on the profile's history before t = 0 and updates it every interval with
the observed demand, like the predictor service does.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from tideshift.loadgen.profiles import RateProfile
from tideshift.services.cluster.port import Node, Resources, WorkloadRef
from tideshift.services.cluster.sim import SimCluster, SimWorkload
from tideshift.services.planner import policy as pol
from tideshift.services.planner.baselines import Policy, make_policy
from tideshift.services.planner.inputs import node_spec, plan_inputs, pod_spec
from tideshift.services.simulator.accounting import Accountant, Sample, trainer_churn
from tideshift.services.simulator.batch import BatchTrainers
from tideshift.services.simulator.forecasters import SimForecaster, make_forecaster
from tideshift.services.simulator.scenario import GIB, JobGroup, Scenario, ServingSpec


@dataclass
class _JobRun:
    group: JobGroup
    ref: WorkloadRef
    policy_job: pol.TrainingJob
    arrival: float
    started_at: float | None = None
    finished_at: float | None = None
    work_done: float = 0.0
    paused_until: float = -math.inf
    last_ready: int = 0


@dataclass
class PolicyResult:
    name: str
    utilization: dict[str, float]
    shortfall_minutes: int
    shortfall_fraction: float
    cpu_used: float
    stranded: dict[str, float]
    serving_starved_minutes: int
    cpu_batch: float
    batch_evictions: int
    training_work: float
    pending_mean_s: float
    pending_p95_s: float
    trainer_churn: int
    training_share_of_spare: float
    jobs_started: int
    jobs_finished: int
    jobs_total: int
    wall_s: float
    series: dict[str, Any] = field(default_factory=dict)

    def summary(self) -> dict[str, Any]:
        return {
            "utilization": {k: round(v, 4) for k, v in self.utilization.items()},
            "shortfall_minutes": self.shortfall_minutes,
            "shortfall_fraction": round(self.shortfall_fraction, 6),
            "cpu_used": round(self.cpu_used, 4),
            "stranded": {k: round(v, 4) for k, v in self.stranded.items()},
            "serving_starved_minutes": self.serving_starved_minutes,
            "cpu_batch": round(self.cpu_batch, 4),
            "batch_evictions": self.batch_evictions,
            "training_work": round(self.training_work, 1),
            "pending_mean_s": round(self.pending_mean_s, 1),
            "pending_p95_s": round(self.pending_p95_s, 1),
            "trainer_churn": self.trainer_churn,
        }


def _nodes(scenario: Scenario) -> list[Node]:
    nodes = []
    for group_index, group in enumerate(scenario.nodes):
        for i in range(group.count):
            nodes.append(
                Node(
                    f"{group.name_prefix}-{group_index}-{i}",
                    Resources(group.cpu, group.memory_gib * GIB, group.gpu),
                )
            )
    return nodes


def _resources(vector: tuple[float, float, float]) -> Resources:
    return Resources(vector[0], vector[1], int(vector[2]))


def _serving_workload(spec: ServingSpec) -> pol.ServingWorkload:
    return pol.ServingWorkload(
        target=pol.Target(spec.namespace, "Deployment", spec.name),
        replica_requests=spec.replica.vector(),
        capacity_rps=spec.capacity_rps * spec.target_utilization,
        min_replicas=spec.min_replicas,
        max_replicas=spec.max_replicas,
        lead_time_s=spec.lead_time_s if spec.lead_time_s is not None else spec.startup_delay_s,
        margin_s=spec.margin_s,
        stabilization_s=spec.stabilization_s,
        quantile=spec.quantile,
        target_utilization=spec.target_utilization,
    )


def _job_arrivals(scenario: Scenario) -> list[tuple[float, JobGroup, str]]:
    arrivals = []
    for group in scenario.training.jobs:
        for i in range(group.count):
            arrivals.append(
                (group.arrival_s + i * group.interval_s, group, f"{group.name_prefix}-{i}")
            )
    arrivals.sort(key=lambda item: (item[0], item[2]))
    return arrivals


def serving_need(spec: ServingSpec, rps: float) -> int:
    need = math.ceil(rps / (spec.capacity_rps * spec.target_utilization) - 1e-9)
    return min(max(need, spec.min_replicas), spec.max_replicas)


class _Run:
    """One policy on a fresh cluster: admits jobs, plans on its cadence, integrates metrics."""

    def __init__(self, scenario: Scenario, profiles: Sequence[RateProfile], name: str) -> None:
        self.scenario = scenario
        self.profiles = profiles
        self.name = name
        self.times = np.arange(0.0, scenario.duration_s, scenario.step_s)
        # Peak needs over the run size the static partition.
        self.peak = {
            pol.Target(spec.namespace, "Deployment", spec.name): max(
                serving_need(spec, profile.rate(float(t))) for t in self.times
            )
            for spec, profile in zip(scenario.serving, profiles, strict=True)
        }
        self.policy: Policy[Any] = make_policy(name, serving_peak=self.peak)
        self.state = self.policy.initial_state()
        self.forecasters = [make_forecaster(scenario, profile) for profile in profiles]
        self.serving = tuple(_serving_workload(spec) for spec in scenario.serving)
        self.serving_refs = [w.target for w in self.serving]
        self.cluster = self._start_cluster()
        self.arrivals = _job_arrivals(scenario)
        self.next_arrival = 0
        self.jobs: list[_JobRun] = []
        self.live: dict[WorkloadRef, _JobRun] = {}
        alloc = self.cluster.allocatable_total()
        self.alloc = alloc
        self.alloc_vector = np.array([alloc.cpu, alloc.memory, float(alloc.gpu)])
        nodes = self.cluster.nodes()
        self.node_row = {node.name: row for row, node in enumerate(nodes)}
        # Only Tideshift lends serving's idle reservation; the baselines run every job on
        # requests, so the same run shows what overcommit adds.
        self.batch = BatchTrainers(
            [node.name for node in nodes],
            np.array(
                [
                    (n.allocatable.cpu, n.allocatable.memory, float(n.allocatable.gpu))
                    for n in nodes
                ],
                dtype=np.float64,
            ).reshape(-1, 3),
        )
        self.lends_batch = name == "tideshift"
        self.starved_now = False
        self.accounts = Accountant()
        self.next_plan = 0.0
        self.plan_every = self.policy.cadence_s or scenario.plan_interval_s
        self.series_every = max(scenario.step_s, scenario.duration_s / 1500)
        self.next_series = 0.0
        self.series: dict[str, Any] = {
            "t": [],
            "demand": [],
            "capacity": [],
            "util_cpu": [],
            "trainers": {},
        }

    def _start_cluster(self) -> SimCluster:
        scenario = self.scenario
        warmup = max([spec.startup_delay_s for spec in scenario.serving] + [0.0]) + 1.0
        cluster = SimCluster(_nodes(scenario), now=-warmup)
        for spec, profile, workload in zip(
            scenario.serving, self.profiles, self.serving, strict=True
        ):
            initial = (
                self.peak[workload.target]
                if self.name == "static"
                else serving_need(spec, profile.rate(0.0))
            )
            cluster.add_workload(
                SimWorkload(
                    ref=workload.target,
                    kind="Deployment",
                    role="serving",
                    pod_requests=_resources(spec.replica.vector()),
                    replicas=initial,
                    priority=spec.priority,
                    startup_delay_s=spec.startup_delay_s,
                    min_replicas=spec.min_replicas,
                    max_replicas=spec.max_replicas,
                )
            )
        # Starting pods become ready by t = 0 (the run starts in a steady state).
        cluster.step(-warmup)
        return cluster

    def tick(self, now: float) -> None:
        self._admit(now)
        demands = [profile.rate(now) for profile in self.profiles]
        if now >= self.next_plan - 1e-9:
            self.next_plan += self.plan_every
            self._plan(now, demands)
        self.cluster.step(now)
        self._bind_batch(now, demands)
        used, capacity_total = self._measure(now, demands)
        if now >= self.next_series - 1e-9:
            self.next_series += self.series_every
            self._record_series(now, demands, used, capacity_total)

    def _non_batch_used(self, demands: Sequence[float]) -> tuple[Any, Any]:
        """(what every non-batch pod uses per node (nodes, 3): serving pods their requests x
        demand / ready capacity (never above 1), every other pod its requests; serving's idle
        reservation per node: its requests minus that use)."""
        cluster = self.cluster
        busy: dict[WorkloadRef, float] = {}
        for spec, ref, demand in zip(
            self.scenario.serving, self.serving_refs, demands, strict=True
        ):
            ready_capacity = cluster.ready_count(ref) * spec.capacity_rps
            busy[ref] = min(1.0, demand / ready_capacity) if ready_capacity > 0 else 0.0
        used = np.zeros_like(self.batch.allocatable)
        idle = np.zeros_like(used)
        for pod in cluster.pods_raw():
            if pod.node is None:
                continue
            fraction = busy.get(pod.owner, 1.0) if pod.role == "serving" else 1.0
            requests = pod.requests
            vector = np.array([requests.cpu, requests.memory, float(requests.gpu)])
            row = self.node_row[pod.node]
            used[row] += fraction * vector
            idle[row] += (1.0 - fraction) * vector
        return used, idle

    def _bind_batch(self, now: float, demands: Sequence[float]) -> None:
        """The planner's shrinks take effect with the step's other changes; starvation is
        measured before eviction: a rise in usage that batch trainers still stood in the way
        of counts, even if they leave within the step."""
        if not self.batch.jobs:
            self.starved_now = False
            return
        used, serving_idle = self._non_batch_used(demands)
        self.batch.shrink(used, serving_idle)
        total = used[:, 0] + self.batch.use()[:, 0]
        self.starved_now = bool(np.any(total > self.batch.allocatable[:, 0] + 1e-6))
        self.batch.evict(used)
        self.batch.grow(used, serving_idle, now)

    def _admit(self, now: float) -> None:
        arrivals = self.arrivals
        while self.next_arrival < len(arrivals) and arrivals[self.next_arrival][0] <= now + 1e-9:
            _, group, name = arrivals[self.next_arrival]
            self.next_arrival += 1
            self._add_job(now, group, name)

    def _add_job(self, now: float, group: JobGroup, name: str) -> None:
        ref = WorkloadRef(group.namespace, "ElasticJob", name)
        policy_job = pol.TrainingJob(
            target=ref,
            trainer_requests=group.trainer.vector(),
            min_trainers=group.min_trainers,
            max_trainers=group.max_trainers,
            gang_min=group.gang_min,
            priority=group.priority,
            weight=group.weight,
            submitted_at=now,
            nominal_trainers=group.nominal_trainers,
            batch=group.batch and self.lends_batch,
        )
        run = _JobRun(group, ref, policy_job, now)
        self.jobs.append(run)
        self.live[ref] = run
        self.series["trainers"][name] = []
        if policy_job.batch:
            self.batch.add(ref, group.trainer.vector(), group.startup_delay_s)
            self.batch.scale(ref, policy_job.floor)
            return
        elastic = self.policy.elastic_training
        replicas = policy_job.floor if elastic else policy_job.nominal
        self.cluster.add_workload(
            SimWorkload(
                ref=ref,
                kind="ElasticJob",
                role="training",
                pod_requests=_resources(group.trainer.vector()),
                replicas=replicas,
                priority=group.priority,
                startup_delay_s=group.startup_delay_s,
                min_replicas=0,
                max_replicas=group.max_trainers,
                gang_min=policy_job.floor if elastic else policy_job.nominal,
                companion_count=group.pservers,
                companion_requests=_resources(group.pserver.vector()),
            )
        )

    def _plan(self, now: float, demands: Sequence[float]) -> None:
        inputs = _plan_inputs(
            self.cluster,
            self.serving,
            live=self.live,
            forecasters=self.forecasters,
            demands=demands,
            now=now,
            batch=self.batch,
        )
        decision, self.state = self.policy.plan(inputs, self.state, now)
        for item in decision.targets:
            ref = item.target
            if ref in self.batch.jobs:
                self.batch.scale(ref, item.desired)
            elif self.cluster.workload(ref).replicas != item.desired:
                self.cluster.scale(ref, item.desired)

    def _measure(self, now: float, demands: Sequence[float]) -> tuple[Any, float]:
        """Integrate the metrics over [now, now + step); returns (bound requests, capacity)."""
        cluster, step = self.cluster, self.scenario.step_s
        bound = cluster.bound_requests_total()
        used = np.array([bound.cpu, bound.memory, float(bound.gpu)])
        capacities = tuple(
            cluster.ready_count(ref) * spec.capacity_rps
            for spec, ref in zip(self.scenario.serving, self.serving_refs, strict=True)
        )
        serving_need_cpu = sum(
            serving_need(spec, demand) * spec.replica.cpu
            for spec, demand in zip(self.scenario.serving, demands, strict=True)
        )
        training_cpu = self._progress_jobs(now)
        other_cpu = (
            bound.cpu
            - training_cpu
            - sum(
                cluster.bound_count(ref) * spec.replica.cpu
                for spec, ref in zip(self.scenario.serving, self.serving_refs, strict=True)
            )
        )
        serving_used_cpu = self._serving_used_cpu(demands)
        used_cpu = bound.cpu - sum(
            cluster.bound_count(ref) * spec.replica.cpu
            for spec, ref in zip(self.scenario.serving, self.serving_refs, strict=True)
        )
        batch_cpu = float(self.batch.use()[:, 0].sum())
        self.accounts.add(
            now,
            now + step,
            Sample(
                allocatable=self.alloc_vector,
                requested=used,
                used_cpu=used_cpu + serving_used_cpu + batch_cpu,
                lent_cpu=batch_cpu,
                stranded=self._stranded(),
                demand_rps=tuple(demands),
                capacity_rps=capacities,
                spare_cpu=max(0.0, self.alloc.cpu - serving_need_cpu - other_cpu),
                training_cpu=training_cpu,
                starved=self.starved_now or bool(np.any(cluster.free_room()[:, 0] < -1e-6)),
            ),
        )
        return used, sum(capacities)

    def _serving_used_cpu(self, demands: Sequence[float]) -> float:
        """Serving's cpu in use: demand / ready capacity x the requests of its bound pods."""
        cluster, used = self.cluster, 0.0
        for spec, ref, demand in zip(
            self.scenario.serving, self.serving_refs, demands, strict=True
        ):
            ready_capacity = cluster.ready_count(ref) * spec.capacity_rps
            requested = cluster.bound_count(ref) * spec.replica.cpu
            busy = min(1.0, demand / ready_capacity) if ready_capacity > 0 else 0.0
            used += busy * requested
        return used

    def _stranded(self) -> Any:
        """Free room on nodes where no trainer of a job that wants more fits."""
        shapes = [
            run.policy_job.trainer_requests
            for ref, run in self.live.items()
            if not run.policy_job.batch
            and self.cluster.bound_count(ref) < run.policy_job.max_trainers
        ]
        return pol.stranded_capacity(
            self.cluster.free_room(), np.array(shapes, dtype=np.float64).reshape(-1, 3)
        )

    def _progress_jobs(self, now: float) -> float:
        """Advance each live job's work over the step; returns the cpu training holds."""
        cluster = self.cluster
        step = self.scenario.step_s
        speedup = self.scenario.training.speedup_exponent
        restart_cost = self.scenario.training.restart_cost_s
        training_cpu = 0.0
        for ref, run in list(self.live.items()):
            if run.policy_job.batch:
                training_cpu += self.batch.bound(ref) * run.group.trainer.cpu
                ready = self.batch.ready(ref, now)
                running = ready >= run.policy_job.floor
            else:
                job_workload = cluster.workload(ref)
                training_cpu += (
                    job_workload.bound_workers * job_workload.pod_requests.cpu
                    + job_workload.bound_companions * job_workload.companion_requests.cpu
                )
                ready = cluster.ready_count(ref)
                running = cluster.job_running(ref)
            if ready != run.last_ready:
                run.paused_until = now + restart_cost
                run.last_ready = ready
            if running:
                if run.started_at is None:
                    run.started_at = now
                if now >= run.paused_until:
                    run.work_done += (ready**speedup) * step
            if run.group.work is not None and run.work_done >= run.group.work:
                run.finished_at = now
                if run.policy_job.batch:
                    self.batch.remove(ref)
                else:
                    cluster.delete_workload(ref)
                del self.live[ref]
        return training_cpu

    def _record_series(
        self, now: float, demands: Sequence[float], used: Any, capacity_total: float
    ) -> None:
        series, alloc_vector = self.series, self.alloc_vector
        series["t"].append(now)
        series["demand"].append(sum(demands))
        series["capacity"].append(capacity_total)
        series["util_cpu"].append(used[0] / alloc_vector[0] if alloc_vector[0] else 0.0)
        for run in self.jobs:
            series["trainers"][run.ref.name].append(self._ready_trainers(run, now))

    def _ready_trainers(self, run: _JobRun, now: float) -> int:
        if run.ref not in self.live:
            return 0
        if run.policy_job.batch:
            return self.batch.ready(run.ref, now)
        return self.cluster.ready_count(run.ref)

    def result(self, wall_s: float) -> PolicyResult:
        duration = self.scenario.duration_s
        accounts, jobs = self.accounts, self.jobs
        pending = sorted(
            (run.started_at if run.started_at is not None else duration) - run.arrival
            for run in jobs
        )
        counters = self.cluster.counters
        churn = trainer_churn(counters.pods_bound, counters.pods_stopped)
        churn += self.batch.started + self.batch.stopped
        return PolicyResult(
            name=self.name,
            utilization=accounts.utilization(),
            shortfall_minutes=len(accounts.shortfall_minutes),
            shortfall_fraction=accounts.shortfall_fraction,
            cpu_used=accounts.cpu_used,
            stranded=accounts.stranded(),
            serving_starved_minutes=len(accounts.starved_minutes),
            cpu_batch=accounts.cpu_lent,
            batch_evictions=self.batch.evicted,
            training_work=sum(run.work_done for run in jobs),
            pending_mean_s=float(np.mean(pending)) if pending else 0.0,
            pending_p95_s=_p95(pending),
            trainer_churn=churn,
            training_share_of_spare=accounts.training_share_of_spare,
            jobs_started=sum(1 for run in jobs if run.started_at is not None),
            jobs_finished=sum(1 for run in jobs if run.finished_at is not None),
            jobs_total=len(jobs),
            wall_s=wall_s,
            series=self.series,
        )


def _p95(ordered: Sequence[float]) -> float:
    if not ordered:
        return 0.0
    return float(ordered[min(len(ordered) - 1, math.ceil(0.95 * len(ordered)) - 1)])


def run_policy(
    scenario: Scenario,
    profiles: Sequence[RateProfile],
    policy_name: str,
    *,
    progress: Callable[[str], None] | None = None,
) -> PolicyResult:
    started_wall = time.perf_counter()
    run = _Run(scenario, profiles, policy_name)
    last_progress = time.perf_counter()
    for tick in run.times:
        now = float(tick)
        run.tick(now)
        if progress is not None and time.perf_counter() - last_progress > 2.0:
            last_progress = time.perf_counter()
            progress(f"{policy_name}: {now / scenario.duration_s:5.1%} of simulated time")
    return run.result(time.perf_counter() - started_wall)


def _plan_inputs(
    cluster: SimCluster,
    serving: tuple[pol.ServingWorkload, ...],
    *,
    live: dict[WorkloadRef, _JobRun],
    forecasters: Sequence[SimForecaster],
    demands: Sequence[float],
    now: float,
    batch: BatchTrainers,
) -> pol.PlanInputs:
    view = pol.ClusterView.build(
        (node_spec(node) for node in cluster.nodes()),
        [
            pod_spec(pod.node, pod.requests, pod.owner, companion=pod.companion)
            for pod in cluster.pods_raw()
        ]
        + batch.pod_specs(),
    )
    return plan_inputs(
        view,
        serving,
        tuple(run.policy_job for run in live.values()),
        {
            workload.target: forecaster.forecast(now)
            for workload, forecaster in zip(serving, forecasters, strict=True)
        },
        wanted={w.ref: w.replicas for w in cluster.workloads()}
        | {ref: job.desired for ref, job in batch.jobs.items()},
        observed_rps={
            workload.target: demand for workload, demand in zip(serving, demands, strict=True)
        },
    )
