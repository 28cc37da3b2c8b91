"""A scenario's world, built once per run: its nodes, its serving workloads (each from the
serving workload spec, `ServingSpec.policy()`), its training jobs' arrivals and what each job
is to the planner and to the cluster, the cluster at the start of a run, the planner's inputs
read from the cluster, and the planner as it is after the demand before t = 0. Decides nothing
over time; imports no clock, bus or Kubernetes.

The warm start: the tideshift planner has run through the demand before a run's start
(`warm_history_s` of each serving workload; by default the history the forecaster is fitted
on, up to the rise window), so a run measures a planner that has been running, or one freshly
installed that read the last day of demand, not one that has just started.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

import numpy as np

from tideshift.events.models import TrainingPolicy
from tideshift.loadgen.core.profiles import RateProfile
from tideshift.services.cluster.core.overcommit import OvercommitConfig
from tideshift.services.cluster.port import Node, Resources, WorkloadRef
from tideshift.services.cluster.sim import SimCluster, SimWorkload
from tideshift.services.core.constants import EPS
from tideshift.services.planner import core as pol
from tideshift.services.planner.core.inputs import node_spec, plan_inputs, pod_spec
from tideshift.services.planner.core.model import Rises
from tideshift.services.planner.core.serving import warm
from tideshift.services.simulator.core.training import JobProgress, WorkModel
from tideshift.services.simulator.forecasters import SimForecaster
from tideshift.services.simulator.lending import LendingCluster
from tideshift.services.simulator.scenario import GIB, JobGroup, Scenario, ServingSpec


def scenario_nodes(scenario: Scenario) -> list[Node]:
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


def resources(vector: tuple[float, float, float]) -> Resources:
    return Resources(vector[0], vector[1], int(vector[2]))


def serving_workload(spec: ServingSpec) -> pol.ServingWorkload:
    return pol.ServingWorkload.of(
        pol.Target(spec.namespace, "Deployment", spec.name), spec.replica.vector(), spec.policy()
    )


def job_arrivals(scenario: Scenario) -> list[tuple[float, JobGroup, str]]:
    """(arrival time, group, job name) of every training job, in arrival order."""
    arrivals = []
    for group in scenario.training.jobs:
        for i in range(group.count):
            arrivals.append(
                (group.arrival_s + i * group.interval_s, group, f"{group.name_prefix}-{i}")
            )
    arrivals.sort(key=lambda item: (item[0], item[2]))
    return arrivals


def planned_job(job: pol.TrainingJob, progress: JobProgress, work: float | None) -> pol.TrainingJob:
    """The job as the planner sees it: a finite job with its true remaining work (what the
    running planner estimates from the job's progress, services/planner/progress.py)."""
    return replace(job, remaining_work=progress.remaining(work))


def replicas_needed(
    rps: float, capacity_rps: float, target_utilization: float, bounds: tuple[int, int]
) -> int:
    """Replicas of `capacity_rps` each (at 100 %) that serve `rps` at the target utilisation,
    within (min, max): what `simulate` and the demo measure serving against."""
    need = math.ceil(rps / (capacity_rps * target_utilization) - EPS)
    return min(max(need, bounds[0]), bounds[1])


def serving_need(spec: ServingSpec, rps: float) -> int:
    """Replicas the demand needs at the target utilisation."""
    bounds = (spec.min_replicas, spec.max_replicas)
    return replicas_needed(rps, spec.capacity_rps, spec.target_utilization, bounds)


def cluster_plan_inputs(
    cluster: SimCluster,
    serving: tuple[pol.ServingWorkload, ...],
    jobs: Sequence[pol.TrainingJob],
    *,
    forecasters: Sequence[SimForecaster],
    demands: Sequence[float],
    now: float,
) -> pol.PlanInputs:
    """The planner's inputs from the simulated cluster, as the planner service builds them
    (batch trainers are pods that request nothing)."""
    view = pol.ClusterView.build(
        (node_spec(node) for node in cluster.nodes()),
        [
            pod_spec(pod.node, pod.requests, pod.owner, companion=pod.companion)
            for pod in cluster.pods_raw()
        ],
    )
    return plan_inputs(
        view,
        serving,
        tuple(jobs),
        {
            workload.target: forecaster.forecast(now)
            for workload, forecaster in zip(serving, forecasters, strict=True)
        },
        wanted={w.ref: w.replicas for w in cluster.workloads()},
        observed_rps={
            workload.target: demand for workload, demand in zip(serving, demands, strict=True)
        },
    )


def stranded(cluster: SimCluster, live: Mapping[WorkloadRef, pol.TrainingJob]) -> pol.FloatArray:
    """Free room on nodes where no trainer of a job that wants more fits."""
    shapes = [
        job.trainer_requests
        for ref, job in live.items()
        if not job.batch and cluster.bound_count(ref) < job.max_trainers
    ]
    return pol.stranded_capacity(
        cluster.free_room(), np.array(shapes, dtype=np.float64).reshape(-1, 3)
    )


# ---- the cluster at the start and the jobs as they arrive ---------------------------------------


def start_cluster(
    scenario: Scenario, serving: Sequence[pol.ServingWorkload], initial: Sequence[int]
) -> LendingCluster:
    """The scenario's nodes with each serving workload at its `initial` replicas, ready by
    t = 0 (a run starts in a steady state)."""
    warmup = max([spec.startup_delay_s for spec in scenario.serving] + [0.0]) + 1.0
    cluster = LendingCluster(
        scenario_nodes(scenario), now=-warmup, batch_use={}, overcommit=OvercommitConfig()
    )
    for spec, workload, replicas in zip(scenario.serving, serving, initial, strict=True):
        cluster.add_workload(
            SimWorkload(
                ref=workload.target,
                kind="Deployment",
                role="serving",
                pod_requests=resources(spec.replica.vector()),
                replicas=replicas,
                priority=spec.priority,
                startup_delay_s=spec.startup_delay_s,
                min_replicas=spec.min_replicas,
                max_replicas=spec.max_replicas,
            )
        )
    cluster.step(-warmup)
    return cluster


def planner_job(
    group: JobGroup, ref: WorkloadRef, *, now: float, batch: bool, work: WorkModel
) -> pol.TrainingJob:
    """A job of `group` as the planner sees it: the training workload spec the group
    describes, submitted `now`, with the scenario's work model."""
    spec = TrainingPolicy(
        min_replicas=group.min_trainers,
        max_replicas=group.max_trainers,
        gang_min=group.gang_min,
        priority=group.priority,
        weight=group.weight,
        batch=batch,
        restart_cost_seconds=work.restart_cost_s,
        speedup_exponent=work.speedup_exponent,
    )
    job = pol.TrainingJob.of(
        ref,
        group.trainer.vector(),
        spec,
        min_trainers=group.min_trainers,
        max_trainers=group.max_trainers,
        submitted_at=now,
    )
    return replace(job, nominal_trainers=group.nominal_trainers)


def job_workload(group: JobGroup, ref: WorkloadRef, *, replicas: int, batch: bool) -> SimWorkload:
    """A job of `group` as the simulated cluster runs it, starting at `replicas` trainers."""
    return SimWorkload(
        ref=ref,
        kind="ElasticJob",
        role="training",
        # a batch trainer requests only the extended batch resources
        pod_requests=resources((0.0, 0.0, 0.0) if batch else group.trainer.vector()),
        replicas=replicas,
        priority=group.priority,
        startup_delay_s=group.startup_delay_s,
        min_replicas=0,
        max_replicas=group.max_trainers,
        # batch trainers bind one by one on lent room, never as a gang
        gang_min=0 if batch else replicas,
        companion_count=group.pservers,
        companion_requests=resources(group.pserver.vector()),
    )


# ---- the planner warmed on the demand before t = 0 ------------------------------------------


def warm_history_s(scenario: Scenario, index: int, config: pol.PolicyConfig) -> float:
    """How much of the demand before t = 0 the `index`-th serving workload's planner saw."""
    chosen = scenario.serving[index].warm_history_s
    if chosen is not None:
        return chosen
    return min(scenario.forecaster.history_s, config.rise_window_s)


def warm_state(
    state: Any,
    scenario: Scenario,
    profiles: Sequence[RateProfile],
    serving: Sequence[pol.ServingWorkload],
    *,
    plan_every_s: float,
) -> Any:
    """`state` with each serving workload's rises derived from its demand before t = 0,
    observed on the plan cadence; any other policy's state as it is."""
    if not isinstance(state, pol.PlanState):
        return state
    config = pol.PolicyConfig()
    rises: dict[pol.Target, Rises] = {}
    for index, (profile, workload) in enumerate(zip(profiles, serving, strict=True)):
        span = warm_history_s(scenario, index, config)
        if span <= 0:
            continue
        observed = warm.sampled(profile.rate, start=-span, end=0.0, every_s=plan_every_s)
        rises[workload.target] = warm.derive(workload, observed, config)
    return warm.warm_state(state, rises)
