"""A scenario's world as the planner and the simulated cluster see it: its nodes, serving
workloads, training-job arrivals and the planner's inputs from the cluster. Decides nothing
over time; imports no clock, bus or Kubernetes."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import replace

import numpy as np

from tideshift.services.cluster.port import Node, Resources, WorkloadRef
from tideshift.services.cluster.sim import SimCluster
from tideshift.services.core.constants import EPS
from tideshift.services.planner import core as pol
from tideshift.services.planner.core.inputs import node_spec, plan_inputs, pod_spec
from tideshift.services.simulator.core.training import JobProgress
from tideshift.services.simulator.forecasters import SimForecaster
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
