"""`tideshift simulate`: policies side by side on the simulated cluster, in simulated time.

Each policy gets a fresh `SimCluster` and the same scenario (see `scenario.py` for the
format). Every `step_s` the loop: admits arriving jobs, lets the policy plan when its cadence is
due (Tideshift every `plan_interval_s`; the baselines plan every step and keep their own
sync periods), applies changed counts to the cluster, steps the cluster, and integrates the
metrics over the step:

* utilisation: requests of bound pods / allocatable, per resource, time-averaged;
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

import argparse
import json
import math
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from tideshift.services.cluster.port import Node, Resources, TargetRef
from tideshift.services.cluster.sim import SimCluster, SimWorkload
from tideshift.services.planner import policy as pol
from tideshift.services.planner.baselines import POLICIES, Policy, make_policy
from tideshift.services.planner.inputs import build_view, to_ref, to_target
from tideshift.services.planner.scenario import (
    GIB,
    JobGroup,
    Scenario,
    ScenarioError,
    ServingSpec,
    load_scenario,
    trace_dir_override,
)
from tideshift.services.planner.traffic import RateProfile

QUANTILES = (0.5, 0.9, 0.95, 0.99)


# ---- forecasters ---------------------------------------------------------------------------


class SimForecaster(Protocol):
    def forecast(self, now: float) -> pol.Forecast: ...


@dataclass
class OracleForecaster:
    """The true future: each interval's highest rate (sampled every `sample_s`)."""

    profile: RateProfile
    interval_s: float
    horizon_s: float
    sample_s: float

    def forecast(self, now: float) -> pol.Forecast:
        start = math.floor(now / self.interval_s) * self.interval_s
        steps = max(1, math.ceil(self.horizon_s / self.interval_s))
        times = tuple(start + i * self.interval_s for i in range(steps))
        per_interval = max(1, math.ceil(self.interval_s / self.sample_s))
        values = tuple(
            max(
                self.profile.rate(t + k * self.interval_s / per_interval)
                for k in range(per_interval)
            )
            for t in times
        )
        return pol.Forecast(issued_at=now, times=times, quantiles={q: values for q in QUANTILES})


@dataclass
class ModelForecaster:
    """The predictor's model, fitted on history before t = 0, updated each interval."""

    profile: RateProfile
    model_name: str
    interval_s: float
    history_s: float
    horizon_s: float
    sample_s: float
    _model: Any = None
    _observed_until: float = 0.0  # start of the next interval to observe
    _cache: tuple[float, pol.Forecast] | None = None

    def _observe(self, start: float) -> float:
        samples = max(1, math.ceil(self.interval_s / self.sample_s))
        return (
            sum(self.profile.rate(start + k * self.interval_s / samples) for k in range(samples))
            / samples
        )

    def _ensure_fitted(self) -> None:
        if self._model is not None:
            return
        from tideshift.services.predictor.models import DEFAULT_MODEL, build_model

        self._model = build_model(self.model_name or DEFAULT_MODEL)
        count = max(2, int(self.history_s // self.interval_s))
        times = np.array([-(count - i) * self.interval_s for i in range(count)])
        values = np.array([self._observe(t) for t in times])
        self._model.fit(times, values)
        self._observed_until = 0.0

    def forecast(self, now: float) -> pol.Forecast:
        self._ensure_fitted()
        new_times = []
        while self._observed_until + self.interval_s <= now + 1e-9:
            new_times.append(self._observed_until)
            self._observed_until += self.interval_s
        if new_times:
            values = [self._observe(t) for t in new_times]
            self._model.update(np.array(new_times), np.array(values))
            self._cache = None
        if self._cache is None:
            steps = max(1, math.ceil(self.horizon_s / self.interval_s))
            predicted = self._model.predict(steps)
            self._cache = (
                now,
                pol.Forecast(
                    issued_at=now,
                    times=tuple(float(t) for t in predicted.timestamps),
                    quantiles={
                        float(q): tuple(float(v) for v in values)
                        for q, values in predicted.quantiles.items()
                    },
                ),
            )
        return self._cache[1]


def make_forecaster(scenario: Scenario, profile: RateProfile) -> SimForecaster:
    spec = scenario.forecaster
    if spec.kind == "oracle":
        return OracleForecaster(profile, spec.interval_s, spec.horizon_s, scenario.step_s)
    return ModelForecaster(
        profile, spec.model or "", spec.interval_s, spec.history_s, spec.horizon_s, scenario.step_s
    )


# ---- the run -------------------------------------------------------------------------------


@dataclass
class _JobRun:
    group: JobGroup
    ref: TargetRef
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


def run_policy(
    scenario: Scenario,
    profiles: Sequence[RateProfile],
    policy_name: str,
    *,
    progress: Callable[[str], None] | None = None,
) -> PolicyResult:
    started_wall = time.perf_counter()
    step = scenario.step_s
    duration = scenario.duration_s
    times = np.arange(0.0, duration, step)
    # Peak needs over the run size the static partition.
    peak = {
        pol.Target(spec.namespace, "Deployment", spec.name): max(
            serving_need(spec, profile.rate(float(t))) for t in times
        )
        for spec, profile in zip(scenario.serving, profiles, strict=True)
    }
    policy: Policy[Any] = make_policy(policy_name, serving_peak=peak)
    state = policy.initial_state()
    forecasters = [make_forecaster(scenario, profile) for profile in profiles]
    serving = tuple(_serving_workload(spec) for spec in scenario.serving)

    warmup = max([spec.startup_delay_s for spec in scenario.serving] + [0.0]) + 1.0
    cluster = SimCluster(_nodes(scenario), now=-warmup)
    for spec, profile, workload in zip(scenario.serving, profiles, serving, strict=True):
        initial = (
            peak[workload.target]
            if policy_name == "static"
            else serving_need(spec, profile.rate(0.0))
        )
        cluster.add_workload(
            SimWorkload(
                ref=to_ref(workload.target),
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
    cluster.step(-warmup)
    # Starting pods become ready by t = 0 (the run starts in a steady state).
    arrivals = _job_arrivals(scenario)
    next_arrival = 0
    jobs: list[_JobRun] = []
    live: dict[TargetRef, _JobRun] = {}
    alloc = cluster.allocatable_total()
    alloc_vector = np.array([alloc.cpu, alloc.memory, float(alloc.gpu)])
    resources_present = [
        name for name, v in zip(pol.RESOURCE_NAMES, alloc_vector, strict=True) if v > 0
    ]
    util_sum = np.zeros(3)
    demand_total = 0.0
    shortfall_total = 0.0
    shortfall_minutes: set[int] = set()
    spare_sum = 0.0
    training_sum = 0.0
    next_plan = 0.0
    plan_every = policy.cadence_s or scenario.plan_interval_s
    series_every = max(step, duration / 1500)
    next_series = 0.0
    series: dict[str, Any] = {"t": [], "demand": [], "capacity": [], "util_cpu": [], "trainers": {}}
    speedup = scenario.training.speedup_exponent
    restart_cost = scenario.training.restart_cost_s
    serving_refs = [to_ref(w.target) for w in serving]
    last_progress = time.perf_counter()

    for tick in times:
        now = float(tick)
        while next_arrival < len(arrivals) and arrivals[next_arrival][0] <= now + 1e-9:
            _, group, name = arrivals[next_arrival]
            next_arrival += 1
            ref = TargetRef(group.namespace, "ElasticJob", name)
            policy_job = pol.TrainingJob(
                target=to_target(ref),
                trainer_requests=group.trainer.vector(),
                min_trainers=group.min_trainers,
                max_trainers=group.max_trainers,
                gang_min=group.gang_min,
                priority=group.priority,
                weight=group.weight,
                submitted_at=now,
                nominal_trainers=group.nominal_trainers,
            )
            elastic = policy.elastic_training
            replicas = policy_job.floor if elastic else policy_job.nominal
            cluster.add_workload(
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
            run = _JobRun(group, ref, policy_job, now)
            jobs.append(run)
            live[ref] = run
            series["trainers"][name] = []

        demands = [profile.rate(now) for profile in profiles]
        if now >= next_plan - 1e-9:
            next_plan += plan_every
            inputs = _plan_inputs(
                cluster, serving, live=live, forecasters=forecasters, demands=demands, now=now
            )
            decision, state = policy.plan(inputs, state, now)
            for item in decision.targets:
                ref = to_ref(item.target)
                if cluster.workload(ref).replicas != item.desired:
                    cluster.scale(ref, item.desired)
        cluster.step(now)

        # -- metrics over [now, now + step)
        bound = cluster.bound_requests_total()
        used = np.array([bound.cpu, bound.memory, float(bound.gpu)])
        util_sum += np.divide(used, alloc_vector, out=np.zeros(3), where=alloc_vector > 0)
        capacity_total = 0.0
        serving_need_cpu = 0.0
        for spec, ref, demand in zip(scenario.serving, serving_refs, demands, strict=True):
            capacity = cluster.ready_count(ref) * spec.capacity_rps
            capacity_total += capacity
            demand_total += demand * step
            missing = max(0.0, demand - capacity)
            if missing > 1e-9:
                shortfall_total += missing * step
                shortfall_minutes.add(int(now // 60))
            serving_need_cpu += serving_need(spec, demand) * spec.replica.cpu
        training_cpu = 0.0
        for ref, run in list(live.items()):
            job_workload = cluster.workload(ref)
            training_cpu += (
                job_workload.bound_workers * job_workload.pod_requests.cpu
                + job_workload.bound_companions * job_workload.companion_requests.cpu
            )
            ready = cluster.ready_count(ref)
            if ready != run.last_ready:
                run.paused_until = now + restart_cost
                run.last_ready = ready
            if cluster.job_running(ref):
                if run.started_at is None:
                    run.started_at = now
                if now >= run.paused_until:
                    run.work_done += (ready**speedup) * step
            if run.group.work is not None and run.work_done >= run.group.work:
                run.finished_at = now
                cluster.delete_workload(ref)
                del live[ref]
        other_cpu = (
            bound.cpu
            - training_cpu
            - sum(
                cluster.bound_count(ref) * spec.replica.cpu
                for spec, ref in zip(scenario.serving, serving_refs, strict=True)
            )
        )
        spare = max(0.0, alloc.cpu - serving_need_cpu - other_cpu)
        spare_sum += spare
        training_sum += min(training_cpu, spare)

        if now >= next_series - 1e-9:
            next_series += series_every
            series["t"].append(now)
            series["demand"].append(sum(demands))
            series["capacity"].append(capacity_total)
            series["util_cpu"].append(used[0] / alloc_vector[0] if alloc_vector[0] else 0.0)
            for run in jobs:
                series["trainers"][run.ref.name].append(
                    cluster.ready_count(run.ref) if run.ref in live else 0
                )
        if progress is not None and time.perf_counter() - last_progress > 2.0:
            last_progress = time.perf_counter()
            progress(f"{policy_name}: {now / duration:5.1%} of simulated time")

    steps_taken = len(times)
    pending = []
    for run in jobs:
        end = run.started_at if run.started_at is not None else duration
        pending.append(end - run.arrival)
    pending.sort()
    counters = cluster.counters
    churn = counters.pods_bound.get("training", 0) + counters.pods_stopped.get("training", 0)
    utilization = {
        name: float(util_sum[i] / steps_taken)
        for i, name in enumerate(pol.RESOURCE_NAMES)
        if name in resources_present
    }
    return PolicyResult(
        name=policy_name,
        utilization=utilization,
        shortfall_minutes=len(shortfall_minutes),
        shortfall_fraction=shortfall_total / demand_total if demand_total else 0.0,
        training_work=sum(run.work_done for run in jobs),
        pending_mean_s=float(np.mean(pending)) if pending else 0.0,
        pending_p95_s=float(pending[min(len(pending) - 1, math.ceil(0.95 * len(pending)) - 1)])
        if pending
        else 0.0,
        trainer_churn=churn,
        training_share_of_spare=training_sum / spare_sum if spare_sum else 0.0,
        jobs_started=sum(1 for run in jobs if run.started_at is not None),
        jobs_finished=sum(1 for run in jobs if run.finished_at is not None),
        jobs_total=len(jobs),
        wall_s=time.perf_counter() - started_wall,
        series=series,
    )


def _plan_inputs(
    cluster: SimCluster,
    serving: tuple[pol.ServingWorkload, ...],
    *,
    live: dict[TargetRef, _JobRun],
    forecasters: Sequence[SimForecaster],
    demands: Sequence[float],
    now: float,
) -> pol.PlanInputs:
    view = build_view(
        cluster.nodes(),
        ((pod.node, pod.requests, pod.owner, pod.companion) for pod in cluster.pods_raw()),
    )
    current = {to_target(w.ref): w.replicas for w in cluster.workloads()}
    return pol.PlanInputs(
        cluster=view,
        serving=serving,
        jobs=tuple(run.policy_job for run in live.values()),
        forecasts={
            workload.target: forecaster.forecast(now)
            for workload, forecaster in zip(serving, forecasters, strict=True)
        },
        current=current,
        observed_rps={
            workload.target: demand for workload, demand in zip(serving, demands, strict=True)
        },
    )


# ---- output --------------------------------------------------------------------------------


def format_table(results: Sequence[PolicyResult]) -> str:
    header = (
        f"{'policy':<10} {'util cpu':>8} {'util mem':>8} {'util gpu':>8} {'short min':>9} "
        f"{'short %':>8} {'train work':>11} {'spare %':>7} {'pend mean':>9} {'pend p95':>9} "
        f"{'churn':>6} {'jobs':>9} {'wall s':>6}"
    )
    lines = [header, "-" * len(header)]
    for r in results:
        gpu = r.utilization.get("gpu")
        lines.append(
            f"{r.name:<10} {r.utilization.get('cpu', 0):>8.1%} "
            f"{r.utilization.get('memory', 0):>8.1%} "
            f"{(f'{gpu:.1%}' if gpu is not None else '-'):>8} "
            f"{r.shortfall_minutes:>9d} {r.shortfall_fraction:>8.3%} {r.training_work:>11.0f} "
            f"{r.training_share_of_spare:>7.1%} {r.pending_mean_s:>9.1f} {r.pending_p95_s:>9.1f} "
            f"{r.trainer_churn:>6d} {f'{r.jobs_started}/{r.jobs_total}':>9} {r.wall_s:>6.1f}"
        )
    return "\n".join(lines)


def plot(result: PolicyResult, scenario: Scenario, out_dir: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    series = result.series
    hours = np.array(series["t"]) / 3600.0
    figure, axes = plt.subplots(3, 1, figsize=(10, 9), sharex=True)
    axes[0].plot(hours, series["demand"], label="demand (req/s)", color="tab:red", lw=1)
    axes[0].plot(
        hours, series["capacity"], label="serving capacity (req/s)", color="tab:blue", lw=1
    )
    axes[0].legend(loc="upper right")
    axes[0].set_title(f"{scenario.name} - {result.name}")
    trainers = series["trainers"]
    if trainers:
        names = sorted(trainers)
        stacked = np.array([np.pad(trainers[n], (len(hours) - len(trainers[n]), 0)) for n in names])
        axes[1].stackplot(hours, stacked, labels=names if len(names) <= 12 else ())
        if len(names) <= 12:
            axes[1].legend(loc="upper right", fontsize="small", ncol=3)
    axes[1].set_ylabel("ready trainers per job")
    axes[2].plot(hours, np.array(series["util_cpu"]) * 100, color="tab:green", lw=1)
    axes[2].set_ylabel("cpu requested / allocatable (%)")
    axes[2].set_ylim(0, 105)
    axes[2].set_xlabel("simulated hours")
    figure.tight_layout()
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"{scenario.name}-{result.name}.png"
    figure.savefig(path, dpi=90)
    plt.close(figure)
    return path


# ---- CLI -----------------------------------------------------------------------------------


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="tideshift simulate",
        description="Run capacity policies side by side on the simulated cluster.",
    )
    parser.add_argument("--scenario", required=True, type=Path, help="scenario YAML file")
    parser.add_argument(
        "--policy",
        action="append",
        dest="policies",
        metavar="NAME",
        help=f"policy to run (repeatable; default all: {', '.join(POLICIES)})",
    )
    parser.add_argument("--out", type=Path, help="directory for one PNG plot per policy")
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    parser.add_argument(
        "--trace-dir",
        help="directory holding the scenario's trace files (default: the path in the "
        "scenario, relative to it; env TIDESHIFT_TRACE_DIR)",
    )
    parser.add_argument(
        "--duration", type=float, help="override the scenario's duration_s (seconds, > 0)"
    )
    return parser


def load_profiles(
    scenario: Scenario, scenario_path: Path, trace_dir: str | None
) -> list[RateProfile]:
    override = trace_dir_override(trace_dir)
    base = scenario_path.resolve().parent
    return [spec.traffic.profile(base, override) for spec in scenario.serving]


def main(argv: Sequence[str]) -> int:
    parser = _parser()
    args = parser.parse_args(list(argv))
    policies = args.policies or list(POLICIES)
    for name in policies:
        if name not in POLICIES:
            parser.error(
                f"--policy: unknown policy {name!r}; expected one of {', '.join(POLICIES)}"
            )
    if args.duration is not None and args.duration <= 0:
        parser.error("--duration: expected seconds > 0")
    try:
        scenario = load_scenario(args.scenario)
        if args.duration is not None:
            scenario = scenario.model_copy(update={"duration_s": args.duration})
        profiles = load_profiles(scenario, args.scenario, args.trace_dir)
    except ScenarioError as exc:
        print(f"tideshift simulate: {exc}", file=sys.stderr)
        return 2

    def progress(message: str) -> None:
        print(message, file=sys.stderr, flush=True)

    results = []
    for name in policies:
        progress(f"simulating {scenario.name} with {name} ...")
        result = run_policy(scenario, profiles, name, progress=progress)
        progress(f"{name}: done in {result.wall_s:.1f} s")
        results.append(result)
        if args.out is not None:
            progress(f"{name}: plot {plot(result, scenario, args.out)}")
    if args.json:
        print(json.dumps({"policies": {r.name: r.summary() for r in results}}, indent=2))
    else:
        print(f"scenario {scenario.name}: {scenario.duration_s:.0f} s simulated")
        print(format_table(results))
    return 0
