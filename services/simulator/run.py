"""The step loop: one policy replayed on the simulated cluster, in simulated time.

The simulator reads in three places: the scenario built into a world (`world.py`: nodes,
serving workloads from the workload spec, job arrivals, the starting cluster, the planner's
inputs and warm start), this loop, and what it measures (`core/measures.py`); `report.py`
prints and plots the results. Each policy gets a fresh `SimCluster` and the same scenario
(see `scenario.py` for the format). Every `step_s` the loop: admits arriving jobs, lets the
policy plan when its cadence is due (Tideshift every `plan_interval_s`; the baselines plan
every step and keep their own sync periods), applies changed counts to the cluster, steps the
cluster, and integrates the metrics over the step (`core/measures.py`, the accountant the demo
shares):

* utilisation: requests of bound pods / allocatable, per resource, time-averaged;
* cpu used: what pods use / allocatable, from a usage model: a serving pod uses
  demand / ready capacity x its request (never above it), every other pod its request; batch
  trainers (jobs with `batch: true`, Tideshift only; `lending.py`, the demo's world too)
  request nothing, bind on serving's idle reservation within the reclaimable capacity and use
  their whole trainer vector (`cpu_batch` is their share);
* stranded capacity: free cpu and GPUs on nodes where not one trainer of a job that wants more
  fits (`policy.stranded_capacity`), as a fraction of allocatable, time-averaged;
* serving starved minutes (must stay 0): minutes in which some node's pods requested, or
  used (batch trainers included, before their eviction), more than its allocatable;
* serving shortfall: request-seconds above ready replicas x `capacity_rps`; minutes with any;
* training work: progress units, ready_trainers ** speedup_exponent per second while the job
  runs (gang and parameter servers ready), none for `restart_cost_s` after its trainer set
  changes (`core/training.py`, the demo's model too); jobs with `work` finish and leave;
* job pending time: arrival until the job first runs (jobs that never run count until the end);
  over-provisioning, cpu shares, JCT and weighted work: `core/measures.py`;
* trainer churn: trainer pods started plus trainer pods stopped while their job went on, and
  by cause (`core/measures.py`);
* training share of spare: training requests / (allocatable - what serving needs at target
  utilisation for the actual demand - other pods), cpu, time-integrated;
* job-hours left behind: hours a live job had no trainer bound while its modelled fair share
  of that same room was at least its gang (`core/fair_share.py`; goal 0), per job too.

Policies: the planner's registry (`planner/core/baselines.py`) and `oracle`, the clairvoyant
bound (`oracle.py`: the planner with the true future and no headroom); `compare_to_oracle`
gives each result its figures as fractions of the oracle's.

Forecasts: `oracle` reads the true future demand; `model` runs the predictor's registry model
(default `portfolio`) as the predictor service does (`forecasters.py`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from tideshift.loadgen.core.profiles import RateProfile
from tideshift.services.cluster.port import WorkloadRef
from tideshift.services.core.constants import EPS, HOUR_S
from tideshift.services.planner import core as pol
from tideshift.services.planner.core.baselines import Policy, make_policy
from tideshift.services.simulator.core import fair_share
from tideshift.services.simulator.core import measures as msr
from tideshift.services.simulator.core.training import JobProgress, WorkModel
from tideshift.services.simulator.forecasters import SimForecaster, make_forecaster
from tideshift.services.simulator.lending import LendingCluster, serving_busy
from tideshift.services.simulator.oracle import ORACLE, oracle_policy, versus_oracle
from tideshift.services.simulator.scenario import JobGroup, Scenario
from tideshift.services.simulator.world import (
    cluster_plan_inputs,
    job_arrivals,
    job_workload,
    planned_job,
    planner_job,
    resources,
    serving_need,
    serving_workload,
    start_cluster,
    stranded,
    warm_state,
)


@dataclass
class _JobRun:
    group: JobGroup
    ref: WorkloadRef
    policy_job: pol.TrainingJob
    arrival: float
    progress: JobProgress = field(default_factory=JobProgress)
    finished_at: float | None = None

    def outcome(self) -> msr.JobOutcome:
        p = self.progress
        return msr.JobOutcome(self.group.name_prefix, self.arrival, p.started_at, self.finished_at)


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
    over_provisioning: dict[str, dict[str, Any]] = field(default_factory=dict)
    cpu_shares: dict[str, float] = field(default_factory=dict)
    job_outcomes: list[msr.JobOutcome] = field(default_factory=list)
    end_s: float = 0.0
    weighted_work: float = 0.0
    series: dict[str, Any] = field(default_factory=dict)
    churn_causes: dict[str, int] = field(default_factory=dict)
    # Serving replicas bound (held) x hours, all serving workloads.
    serving_replica_h: float = 0.0
    # The reachable minimum of it: at every step the whole replicas the demand then needs at
    # the target utilisation, within min and max replicas (no policy holds less unshort).
    serving_minimum_replica_h: float = 0.0
    # This policy's figures as fractions of the oracle's in the same run (`oracle.py`).
    vs_oracle: dict[str, float] = field(default_factory=dict)
    # Per job: hours at zero trainers while its fair share was positive (`core/fair_share.py`).
    left_behind_h: dict[str, float] = field(default_factory=dict)

    @property
    def job_hours_left_behind(self) -> float:
        """Job-hours at zero trainers while the job's fair share was positive (goal 0)."""
        return sum(self.left_behind_h.values())

    @property
    def over_minimum(self) -> float:
        """Serving replica-hours over the reachable minimum's (1: never more than needed)."""
        minimum = self.serving_minimum_replica_h
        return self.serving_replica_h / minimum if minimum > 0 else 1.0

    def figures(self) -> tuple[float, float, float]:
        """(training work, serving replica-hours, trainer churn): what `vs_oracle` compares."""
        return (self.training_work, self.serving_replica_h, float(self.trainer_churn))

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
            "churn_causes": self.churn_causes,
            "weighted_work": round(self.weighted_work, 1),
            "over_provisioning": self.over_provisioning,
            "cpu_shares": {k: round(v, 4) for k, v in self.cpu_shares.items()},
            "jobs": msr.job_times(self.job_outcomes, self.end_s),
            "serving_replica_hours": round(self.serving_replica_h, 2),
            "serving_replica_hours_vs_minimum": round(self.over_minimum, 4),
            "job_hours_left_behind": round(self.job_hours_left_behind, 3),
            "job_hours_left_behind_by_job": {
                name: round(hours, 3) for name, hours in self.left_behind_h.items() if hours > 0
            },
            **{key: round(value, 4) for key, value in self.vs_oracle.items()},
        }


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
        self.serving = tuple(serving_workload(spec) for spec in scenario.serving)
        self.policy: Policy[Any]
        self.forecasters: list[SimForecaster]
        if name == ORACLE:
            oracle = oracle_policy(
                self.serving,
                profiles,
                [spec.startup_delay_s for spec in scenario.serving],
                plan_every_s=scenario.plan_interval_s,
                step_s=scenario.step_s,
                horizon_s=scenario.forecaster.horizon_s,
            )
            # The oracle plans on the truth: the scenario's forecaster would run for nothing.
            self.policy, self.forecasters = oracle, list(oracle.forecasters)
        else:
            self.policy = make_policy(name, serving_peak=self.peak)
            self.forecasters = [make_forecaster(scenario, profile) for profile in profiles]
        self.state = self.policy.initial_state()
        self.serving_refs = [w.target for w in self.serving]
        self.cluster = self._start_cluster()
        self.arrivals = job_arrivals(scenario)
        self.next_arrival = 0
        self.jobs: list[_JobRun] = []
        self.live: dict[WorkloadRef, _JobRun] = {}
        alloc = self.cluster.allocatable_total()
        self.alloc = alloc
        self.alloc_vector = np.array([alloc.cpu, alloc.memory, float(alloc.gpu)])
        # Only Tideshift (and its clairvoyant bound) lends serving's idle reservation; the
        # baselines run every job on requests, so the same run shows what overcommit adds.
        self.lends_batch = name in ("tideshift", ORACLE)
        self.serving_replica_s = 0.0
        self.serving_minimum_s = 0.0
        self.left_behind_s: dict[str, float] = {}
        self.node_alloc = np.array(
            [
                (n.allocatable.cpu, n.allocatable.memory, float(n.allocatable.gpu))
                for n in self.cluster.nodes()
                if n.schedulable
            ],
            dtype=np.float64,
        ).reshape(-1, 3)
        training = scenario.training
        self.work_model = WorkModel(training.speedup_exponent, training.restart_cost_s)
        self.accounts = msr.Accountant()
        self.churn = msr.ChurnCauses()
        self.measures = msr.StepMeasures(
            tuple(spec.name for spec in scenario.serving),
            tuple(spec.capacity_rps for spec in scenario.serving),
        )
        self.next_plan = 0.0
        self.plan_every = self.policy.cadence_s or scenario.plan_interval_s
        if name != ORACLE:  # the oracle forgets learned rises before every plan
            self.state = warm_state(
                self.state, scenario, profiles, self.serving, plan_every_s=self.plan_every
            )
        self.series_every = max(scenario.step_s, scenario.duration_s / 1500)
        self.next_series = 0.0
        series_keys = ("t", "demand", "capacity", "util_cpu")
        self.series: dict[str, Any] = {key: [] for key in series_keys} | {"trainers": {}}

    def _start_cluster(self) -> LendingCluster:
        initial = [
            self.peak[workload.target]
            if self.name == "static"
            else serving_need(spec, profile.rate(0.0))
            for spec, profile, workload in zip(
                self.scenario.serving, self.profiles, self.serving, strict=True
            )
        ]
        return start_cluster(self.scenario, self.serving, initial)

    def tick(self, now: float) -> None:
        self._admit(now)
        self.churn.observe_jobs(self.live)
        demands = [profile.rate(now) for profile in self.profiles]
        if now >= self.next_plan - EPS:
            self.next_plan += self.plan_every
            self._plan(now, demands)
        starved = self.cluster.step_serving(
            now,
            {
                ref: (demand, spec.capacity_rps)
                for spec, ref, demand in zip(
                    self.scenario.serving, self.serving_refs, demands, strict=True
                )
            },
        )
        used, capacity_total = self._measure(now, demands, starved=starved)
        if now >= self.next_series - EPS:
            self.next_series += self.series_every
            self._record_series(now, demands, used, capacity_total)
        counters = self.cluster.counters
        self.churn.count(msr.trainer_churn(counters.pods_bound, counters.pods_stopped))

    def _admit(self, now: float) -> None:
        arrivals = self.arrivals
        while self.next_arrival < len(arrivals) and arrivals[self.next_arrival][0] <= now + EPS:
            _, group, name = arrivals[self.next_arrival]
            self.next_arrival += 1
            self._add_job(now, group, name)

    def _add_job(self, now: float, group: JobGroup, name: str) -> None:
        ref = WorkloadRef(group.namespace, "ElasticJob", name)
        batch = group.batch and self.lends_batch
        policy_job = planner_job(group, ref, now=now, batch=batch, work=self.work_model)
        run = _JobRun(group, ref, policy_job, now)
        self.jobs.append(run)
        self.live[ref] = run
        self.series["trainers"][name] = []
        elastic = self.policy.elastic_training or batch
        replicas = policy_job.floor if elastic else policy_job.nominal
        workload = job_workload(group, ref, replicas=replicas, batch=batch)
        if batch:
            self.cluster.add_batch_workload(workload, resources(group.trainer.vector()))
        else:
            self.cluster.add_workload(workload)

    def _plan(self, now: float, demands: Sequence[float]) -> None:
        inputs = cluster_plan_inputs(
            self.cluster,
            self.serving,
            [planned_job(j.policy_job, j.progress, j.group.work) for j in self.live.values()],
            forecasters=self.forecasters,
            demands=demands,
            now=now,
        )
        decision, self.state = self.policy.plan(inputs, self.state, now)
        self.measures.add_plan(decision.targets, self.plan_every)
        self.churn.observe_plan(self.live, decision.targets)
        for item in decision.targets:
            if self.cluster.workload(item.target).replicas != item.desired:
                self.cluster.scale(item.target, item.desired)

    def _measure(self, now: float, demands: Sequence[float], *, starved: bool) -> tuple[Any, float]:
        """Integrate the metrics over [now, now + step); returns (bound requests, capacity)."""
        cluster, step = self.cluster, self.scenario.step_s
        bound = cluster.bound_requests_total()
        requested = np.array([bound.cpu, bound.memory, float(bound.gpu)])
        capacities = tuple(
            cluster.ready_count(ref) * spec.capacity_rps
            for spec, ref in zip(self.scenario.serving, self.serving_refs, strict=True)
        )
        needs = [
            serving_need(spec, demand)
            for spec, demand in zip(self.scenario.serving, demands, strict=True)
        ]
        serving_need_cpu = sum(
            need * spec.replica.cpu for spec, need in zip(self.scenario.serving, needs, strict=True)
        )
        self.serving_minimum_s += sum(needs) * step
        self._count_left_behind(requested, needs)
        training_cpu = self._progress_jobs(now)
        serving_bound = [cluster.bound_count(ref) for ref in self.serving_refs]
        serving_cpu = sum(
            count * spec.replica.cpu
            for spec, count in zip(self.scenario.serving, serving_bound, strict=True)
        )
        self.serving_replica_s += sum(serving_bound) * step
        lent_cpu = cluster.lent_cpu() if cluster.batch_use else 0.0
        serving_used = self._serving_used_cpu(demands)
        self.measures.add(
            demands,
            capacities,
            alloc_cpu=self.alloc.cpu,
            cpu=(training_cpu, serving_cpu, serving_used),
        )
        self.accounts.add(
            now,
            now + step,
            msr.Sample(
                allocatable=self.alloc_vector,
                requested=requested,
                used_cpu=bound.cpu - serving_cpu + serving_used + lent_cpu,
                lent_cpu=lent_cpu,
                stranded=stranded(cluster, {ref: run.policy_job for ref, run in self.live.items()}),
                demand_rps=tuple(demands),
                capacity_rps=capacities,
                spare_cpu=max(
                    0.0,
                    self.alloc.cpu - serving_need_cpu - (bound.cpu - training_cpu - serving_cpu),
                ),
                training_cpu=training_cpu,
                starved=starved or bool(np.any(cluster.free_room()[:, 0] < -1e-6)),
            ),
        )
        return requested, sum(capacities)

    def _count_left_behind(self, requested: Any, needs: Sequence[int]) -> None:
        """Add the step to each live job with no trainer bound whose fair share of the room
        serving's need for the actual demand leaves was positive (`core/fair_share.py`)."""
        cluster, live = self.cluster, list(self.live.values())
        if not any(cluster.workload(run.ref).bound_workers == 0 for run in live):
            return
        training = np.zeros(3)
        for run in live:
            workload = cluster.workload(run.ref)
            companions = workload.companion_requests
            training += workload.bound_workers * np.array(run.group.trainer.vector())
            training += workload.bound_companions * np.array(
                (companions.cpu, companions.memory, float(companions.gpu))
            )
        serving_bound = np.zeros(3)
        serving_need = np.zeros(3)
        for spec, ref, need in zip(self.scenario.serving, self.serving_refs, needs, strict=True):
            replica = np.array(spec.replica.vector())
            serving_bound += cluster.bound_count(ref) * replica
            serving_need += need * replica
        other = np.maximum(np.asarray(requested) - training - serving_bound, 0.0)
        jobs = [
            fair_share.ShareJob(
                request=run.group.trainer.vector(),
                gang=run.policy_job.gang_min or run.policy_job.min_trainers,
                most=run.policy_job.max_trainers,
                weight=run.policy_job.weight,
                priority=run.policy_job.priority,
            )
            for run in live
        ]
        room = self.alloc_vector - serving_need - other
        owed = fair_share.positive(jobs, fair_share.fair_shares(jobs, self.node_alloc, room))
        for run, is_owed in zip(live, owed, strict=True):
            if is_owed and cluster.workload(run.ref).bound_workers == 0:
                name = run.ref.name
                self.left_behind_s[name] = self.left_behind_s.get(name, 0.0) + self.scenario.step_s

    def _serving_used_cpu(self, demands: Sequence[float]) -> float:
        """Serving's cpu in use: demand / ready capacity x the requests of its bound pods."""
        cluster, used = self.cluster, 0.0
        for spec, ref, demand in zip(
            self.scenario.serving, self.serving_refs, demands, strict=True
        ):
            busy = serving_busy(demand, cluster.ready_count(ref) * spec.capacity_rps)
            used += busy * cluster.bound_count(ref) * spec.replica.cpu
        return used

    def _progress_jobs(self, now: float) -> float:
        """Advance each live job's work over the step; returns the cpu training holds (a batch
        job's trainers count what they use: they request nothing)."""
        cluster, step = self.cluster, self.scenario.step_s
        training_cpu = 0.0
        for ref, run in list(self.live.items()):
            workload = cluster.workload(ref)
            training_cpu += (
                workload.bound_workers * run.group.trainer.cpu
                + workload.bound_companions * workload.companion_requests.cpu
            )
            run.progress.advance(
                now,
                now + step,
                ready=cluster.ready_count(ref),
                running=cluster.job_running(ref),
                model=self.work_model,
            )
            if run.group.work is not None and run.progress.work >= run.group.work:
                run.finished_at = now
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
            ready = self.cluster.ready_count(run.ref) if run.ref in self.live else 0
            series["trainers"][run.ref.name].append(ready)

    def result(self, wall_s: float) -> PolicyResult:
        duration = self.scenario.duration_s
        accounts, jobs, alloc = self.accounts, self.jobs, self.alloc_vector
        pending = msr.queueing([run.outcome() for run in jobs], duration)
        counters = self.cluster.counters
        return PolicyResult(
            name=self.name,
            utilization=accounts.utilization(),
            shortfall_minutes=len(accounts.shortfall_minutes),
            shortfall_fraction=accounts.shortfall_fraction,
            cpu_used=accounts.cpu_used,
            stranded=accounts.stranded(),
            serving_starved_minutes=len(accounts.starved_minutes),
            cpu_batch=accounts.cpu_lent,
            batch_evictions=self.cluster.batch_evictions,
            training_work=sum(run.progress.work for run in jobs),
            pending_mean_s=float(np.mean(pending)) if pending else 0.0,
            pending_p95_s=msr.p95(pending),
            trainer_churn=msr.trainer_churn(counters.pods_bound, counters.pods_stopped),
            training_share_of_spare=accounts.training_share_of_spare,
            jobs_started=sum(1 for run in jobs if run.progress.started_at is not None),
            jobs_finished=sum(1 for run in jobs if run.finished_at is not None),
            jobs_total=len(jobs),
            wall_s=wall_s,
            over_provisioning=self.measures.over_provisioning(),
            cpu_shares=self.measures.cpu_shares(),
            job_outcomes=[run.outcome() for run in jobs],
            end_s=duration,
            weighted_work=sum(
                run.progress.work * msr.dominant_cores(run.group.trainer.vector(), alloc)
                for run in jobs
            ),
            series=self.series,
            churn_causes=dict(self.churn.counts),
            serving_replica_h=self.serving_replica_s / HOUR_S,
            serving_minimum_replica_h=self.serving_minimum_s / HOUR_S,
            left_behind_h={name: s / HOUR_S for name, s in self.left_behind_s.items()},
        )


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


def compare_to_oracle(results: Sequence[PolicyResult]) -> None:
    """Set each result's `vs_oracle` from the oracle's result among them (none without)."""
    fractions = versus_oracle({r.name: r.figures() for r in results})
    for r in results:
        r.vs_oracle = fractions.get(r.name, {})
