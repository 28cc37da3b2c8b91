"""The embedded-default demo: embedded NATS, the sim cluster, every service, real trainers.

Wiring: one Bus connection per service, exactly as separate processes would have; the watcher
and executor see the `SimCluster` through `SimClusterPort`; the predictor reads demand from a
metric source backed by the traffic profile; the planner plans; the executor scales the sim;
coordinators, parameter servers and one trainer process per ready trainer pod do real training
over the same NATS. The demo itself only steps the cluster's time, follows the trainer pods with
real processes, measures, and prints.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tideshift.events.client import EventClient
from tideshift.events.subjects import ROOT
from tideshift.loadgen.core.profiles import RateProfile
from tideshift.services.cluster.sim import SimCluster, SimClusterPort
from tideshift.services.common.bus import Bus
from tideshift.services.common.embedded_nats import EmbeddedNats
from tideshift.services.core.constants import DAY_S, HOUR_S
from tideshift.services.demo import pipeline
from tideshift.services.demo.clock import DEFAULT_START, SimClock
from tideshift.services.demo.fleet import DEMO_DATASET, TrainingFleet
from tideshift.services.demo.meter import Meter
from tideshift.services.demo.progress import ProgressRecorder
from tideshift.services.demo.report import DemoSummary, summarize
from tideshift.services.demo.world import WorldShape, build_cluster
from tideshift.services.simulator.lending import LendingCluster

log = logging.getLogger("tideshift.demo")


@dataclass(frozen=True)
class SimDemoConfig:
    out: Path
    profile: RateProfile
    profile_name: str
    hours: float = 24.0
    speed: float = 288.0  # simulated seconds per wall second: a day in five minutes
    # The services run this long before the measured day (unmeasured): the night then starts
    # from the evening's state, not from pods placed all at once. A whole multiple of the
    # predictor's refit period keeps its refits at 00:00, 06:00, 12:00 and 18:00.
    warmup_hours: float = 6.0
    world: WorldShape = field(default_factory=WorldShape)
    nats_port: int = 0
    real_trainers: bool = True
    min_task_seconds: float = 1.0
    tick_wall_s: float = 0.1
    progress_every_wall_s: float = 0.5
    plan_interval_wall_s: float = 0.5
    forecast_interval_wall_s: float = 1.0
    trainer_start_timeout_wall_s: float = 120.0


@dataclass
class EventLog:
    """Every Tideshift event on the bus, one CloudEvent JSON per line; and what it says."""

    path: Path
    counts: dict[str, int] = field(default_factory=dict)
    job_progress: dict[str, dict[str, Any]] = field(default_factory=dict)
    scale_commands: int = 0

    async def follow(self, url: str, ready: asyncio.Event) -> None:
        client = await EventClient.connect(url, name="tideshift-demo-event-log")
        try:
            with self.path.open("a") as handle:
                events = client.subscribe(f"{ROOT}.>")
                iterator = events.__aiter__()
                first = asyncio.ensure_future(iterator.__anext__())
                await asyncio.sleep(0.05)  # the subscription is registered on the first pull
                ready.set()
                pending: Any = first
                while True:
                    envelope = await pending
                    pending = asyncio.ensure_future(iterator.__anext__())
                    handle.write(envelope.to_json() + "\n")
                    kind = envelope.type
                    self.counts[kind] = self.counts.get(kind, 0) + 1
                    data = envelope.data
                    if kind.startswith("io.tideshift.training.progress."):
                        self.job_progress[data.job] = {
                            "epoch": data.epoch,
                            "applied_total": data.applied_total,
                            "redelivered": data.redelivered,
                            "trainers": data.trainers,
                        }
        finally:
            with contextlib.suppress(Exception):
                await client.close()


def ready_trainer_pods(cluster: SimCluster, shape: WorldShape) -> dict[str, list[str]]:
    pods: dict[str, list[str]] = {job.name: [] for job in shape.jobs}
    names = {job.ref: job.name for job in shape.jobs}
    for pod in cluster.pods():
        job = names.get(pod.owner) if pod.owner is not None else None
        if job is not None and pod.ready and not pod.companion:
            pods[job].append(pod.name)
    return pods


def progress_line(
    clock_elapsed_s: float,
    *,
    demand: float,
    cluster: SimCluster,
    shape: WorldShape,
    meter: Meter,
    fleet: TrainingFleet | None,
) -> str:
    day, rest = divmod(clock_elapsed_s, DAY_S)
    hours, rest = divmod(rest, HOUR_S)
    serving = shape.serving
    ready = cluster.ready_count(serving.ref)
    desired = cluster.workload(serving.ref).replicas
    trainers = " ".join(
        f"{job.name}={cluster.ready_count(job.ref)}"
        + (f"({fleet.live_trainers(job.name)})" if fleet is not None else "")
        for job in shape.jobs
    )
    allocatable = cluster.allocatable_total().cpu
    util = cluster.bound_requests_total().cpu / allocatable if allocatable else 0.0
    return (
        f"day {int(day)} {int(hours):02d}:{int(rest // 60):02d} | demand {demand:6.0f} req/s | "
        f"serving {ready}/{desired} replicas ({ready * serving.capacity_rps:6.0f} req/s) | "
        f"trainers {trainers} | cpu {util:5.1%} | short {len(meter.accounts.shortfall_minutes)} min"
    )


async def run_sim_demo(
    config: SimDemoConfig, *, progress: Callable[[str], None]
) -> tuple[DemoSummary, Meter, EventLog]:
    """Run the demo to the end; returns what it measured (outputs are written by the caller)."""
    started_wall = time.monotonic()
    run = _SimDemoRun(config, progress)
    await asyncio.to_thread(run.nats.start)
    try:
        summary, meter = await run.measure_the_day()
    finally:
        await run.shut_down()
    summary.wall_s = time.monotonic() - started_wall
    run.add_training_figures(summary)
    return summary, meter, run.event_log


def _cluster_ready_at_start(
    shape: WorldShape, *, start: float, initial_demand_rps: float
) -> LendingCluster:
    """The world before the clock starts: serving sized for the demand at `start`, pods ready
    there."""
    warmup = max([shape.serving.startup_delay_s] + [j.startup_delay_s for j in shape.jobs])
    cluster = build_cluster(shape, now=start - warmup - 1, initial_demand_rps=initial_demand_rps)
    cluster.step(start - warmup - 1)
    cluster.step(start)
    return cluster


class _SimDemoRun:
    """One run of the sim demo: the embedded NATS, the services, the trainer fleet, the log."""

    def __init__(self, config: SimDemoConfig, progress: Callable[[str], None]) -> None:
        self.config = config
        self.progress = progress
        self.nats = EmbeddedNats(port=config.nats_port)
        self.event_log = EventLog(config.out / "events.jsonl")
        self.fleet: TrainingFleet | None = None
        self.progress_recorder: ProgressRecorder | None = None
        self._stopping = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self._buses: list[Bus] = []

    async def measure_the_day(self) -> tuple[DemoSummary, Meter]:
        """Start everything with time frozen, then run the simulated hours and measure them."""
        config, shape = self.config, self.config.world
        clock = SimClock(
            config.speed, frozen=True, begin=DEFAULT_START - config.warmup_hours * HOUR_S
        )
        cluster = _cluster_ready_at_start(
            shape,
            start=clock.begin,
            initial_demand_rps=config.profile.rate(clock.begin - clock.start),
        )
        await self._start_event_log()
        await self._start_services(cluster, clock)
        if config.real_trainers:
            await self._start_training(cluster)
            await self._start_progress_recorder(clock)
        clock.run()
        meter = Meter(shape, start=clock.start, sample_every_s=max(60.0, config.hours * 3600 / 600))
        end = clock.start + config.hours * HOUR_S
        await self._run_until(end, clock=clock, cluster=cluster, meter=meter)
        counters = cluster.counters
        churn = counters.pods_bound.get("training", 0) + counters.pods_stopped.get("training", 0)
        return summarize(meter, end=end, trainer_churn=churn, wall_s=0.0), meter

    async def _start_event_log(self) -> None:
        log_ready = asyncio.Event()
        self._tasks.append(asyncio.create_task(self.event_log.follow(self.nats.url, log_ready)))
        await asyncio.wait_for(log_ready.wait(), 10)

    async def _connect(self, name: str) -> Bus:
        # The embedded server provisioned the streams as it started.
        bus = await Bus.connect(self.nats.url, name=f"demo-{name}")
        self._buses.append(bus)
        return bus

    async def _start_services(self, cluster: LendingCluster, clock: SimClock) -> None:
        config = self.config
        stages = await pipeline.start_services(
            connect=self._connect,
            port=SimClusterPort(cluster),
            clock=clock,
            profile=config.profile,
            world=config.world,
            stopping=self._stopping,
            plan_interval_wall_s=config.plan_interval_wall_s,
            forecast_interval_wall_s=config.forecast_interval_wall_s,
        )
        self._tasks.extend(stages.tasks)
        await stages.wait_ready(timeout=60.0)

    async def _start_training(self, cluster: SimCluster) -> None:
        """Start a trainer process per ready trainer pod; wait (bounded) until every job that
        has one trains."""
        config = self.config
        fleet = self.fleet = TrainingFleet(
            nats_url=self.nats.url,
            log_dir=config.out / "logs",
            min_task_seconds=config.min_task_seconds,
            data_dir=config.out / "data",
        )
        for job in config.world.jobs:
            await fleet.start_job(job.name, pservers=job.pservers)
        ready = ready_trainer_pods(cluster, config.world)
        for job_name, pods in ready.items():
            await fleet.reconcile(job_name, pods)
        # Time starts once every job with ready trainers trains (Python processes take seconds
        # to start on a busy machine; a frozen clock keeps that out of the simulated day). A
        # batch job may start with none: it has nothing to wait for.
        jobs = [job for job in config.world.jobs if ready[job.name]]
        deadline = time.monotonic() + config.trainer_start_timeout_wall_s
        while time.monotonic() < deadline:
            running = sum(
                1
                for job in jobs
                if self.event_log.job_progress.get(job.name, {}).get("applied_total", 0) > 0
            )
            self.progress(f"starting: {running}/{len(jobs)} training jobs running")
            if running == len(jobs):
                break
            fleet.reap()
            if fleet.crashed:
                raise RuntimeError(f"a training process exited at start; see {config.out / 'logs'}")
            await asyncio.sleep(0.5)

    async def _start_progress_recorder(self, clock: SimClock) -> None:
        """Real training's progress, sampled over the day (samples applied, held-out loss)."""
        recorder = self.progress_recorder = ProgressRecorder(
            await self._connect("progress"),
            [job.name for job in self.config.world.jobs],
            samples_per_update=DEMO_DATASET.batch_size,
        )
        progress = self.event_log.job_progress
        self._tasks.append(
            asyncio.create_task(
                recorder.follow(
                    clock_s=lambda: clock.now() - clock.start,
                    applied_batches=lambda job: int(progress.get(job, {}).get("applied_total", 0)),
                    stopping=self._stopping,
                ),
                name="progress",
            )
        )

    async def _run_until(
        self, end: float, *, clock: SimClock, cluster: LendingCluster, meter: Meter
    ) -> None:
        """Tick: step the cluster, measure, follow the trainer pods, report progress."""
        config = self.config
        next_progress = 0.0
        serving = config.world.serving
        while True:
            now = min(clock.now(), end)
            demand = config.profile.rate(now - clock.start)
            # the world `simulate` steps: serving as busy as demand keeps it, batch trainers
            # making way (starvation is measured before they do)
            starved = cluster.step_serving(now, {serving.ref: (demand, serving.capacity_rps)})
            if now >= clock.start:
                meter.record(now, cluster, demand, lent_cpu=cluster.lent_cpu(), starved=starved)
            if self.fleet is not None:
                self.fleet.reap()
                for job_name, pods in ready_trainer_pods(cluster, config.world).items():
                    await self.fleet.reconcile(job_name, pods)
            wall = time.monotonic()
            if wall >= next_progress:
                next_progress = wall + config.progress_every_wall_s
                self.progress(
                    progress_line(
                        now - clock.start,
                        demand=demand,
                        cluster=cluster,
                        shape=config.world,
                        meter=meter,
                        fleet=self.fleet,
                    )
                )
            self._raise_if_a_service_failed()
            if now >= end:
                break
            await asyncio.sleep(config.tick_wall_s)

    def _raise_if_a_service_failed(self) -> None:
        for task in self._tasks:
            if task.done() and not task.cancelled() and task.exception() is not None:
                raise RuntimeError(f"a demo service failed: {task.exception()!r}")

    async def shut_down(self) -> None:
        """Stop trainers, services, connections and NATS, whatever state the run reached."""
        self._stopping.set()
        if self.fleet is not None:
            await self.fleet.stop_all()
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(BaseException):
                await task
        for bus in self._buses:
            with contextlib.suppress(Exception):
                await bus.close()
        await asyncio.to_thread(self.nats.stop)

    def add_training_figures(self, summary: DemoSummary) -> None:
        """What the event log saw and what the fleet's processes did."""
        summary.training = dict(self.event_log.job_progress)
        if self.progress_recorder is not None:
            summary.training_series = self.progress_recorder.series()
            for job, points in self.progress_recorder.points.items():
                losses = [p.holdout_loss for p in points if p.holdout_loss is not None]
                if job in summary.training and losses:
                    summary.training[job]["holdout_logloss"] = round(losses[-1], 5)
        summary.events = dict(sorted(self.event_log.counts.items()))
        if self.fleet is not None:
            summary.processes = {
                "started": self.fleet.started,
                "stopped": self.fleet.stopped,
                "crashed": self.fleet.crashed,
            }
