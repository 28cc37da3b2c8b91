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
from tideshift.loadgen.profiles import RateProfile
from tideshift.services.cluster.sim import SimCluster, SimClusterPort
from tideshift.services.common.bus import Bus
from tideshift.services.common.embedded_nats import EmbeddedNats
from tideshift.services.demo import pipeline
from tideshift.services.demo.clock import SimClock
from tideshift.services.demo.fleet import TrainingFleet
from tideshift.services.demo.report import DemoSummary, summarize
from tideshift.services.demo.world import Meter, WorldShape, build_cluster

log = logging.getLogger("tideshift.demo")


@dataclass(frozen=True)
class SimDemoConfig:
    out: Path
    profile: RateProfile
    profile_name: str
    hours: float = 24.0
    speed: float = 288.0  # simulated seconds per wall second: a day in five minutes
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
                            "logloss": data.logloss,
                        }
        finally:
            with contextlib.suppress(Exception):
                await client.close()


def ready_trainer_pods(cluster: SimCluster, shape: WorldShape) -> dict[str, list[str]]:
    pods: dict[str, list[str]] = {job.name: [] for job in shape.jobs}
    names = {job.ref: job.name for job in shape.jobs}
    for pod in cluster.pods_raw():
        job = names.get(pod.owner)
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
    day, rest = divmod(clock_elapsed_s, 86_400)
    hours, rest = divmod(rest, 3600)
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
        f"trainers {trainers} | cpu {util:5.1%} | short {len(meter.shortfall_minutes)} min"
    )


async def run_sim_demo(
    config: SimDemoConfig, *, progress: Callable[[str], None]
) -> tuple[DemoSummary, Meter, EventLog]:
    """Run the demo to the end; returns what it measured (outputs are written by the caller)."""
    started_wall = time.monotonic()
    shape = config.world
    nats = EmbeddedNats(port=config.nats_port)
    await asyncio.to_thread(nats.start)
    stopping = asyncio.Event()
    tasks: list[asyncio.Task[None]] = []
    buses: list[Bus] = []
    fleet: TrainingFleet | None = None
    event_log = EventLog(config.out / "events.jsonl")
    try:
        # The world before the clock starts: serving sized for midnight, pods ready at t = 0.
        warmup = max([shape.serving.startup_delay_s] + [j.startup_delay_s for j in shape.jobs])
        clock = SimClock(config.speed, frozen=True)
        cluster = build_cluster(
            shape, now=clock.start - warmup - 1, initial_demand_rps=config.profile.rate(0.0)
        )
        cluster.step(clock.start - warmup - 1)
        cluster.step(clock.start)

        log_ready = asyncio.Event()
        tasks.append(asyncio.create_task(event_log.follow(nats.url, log_ready)))
        await asyncio.wait_for(log_ready.wait(), 10)

        async def connect(name: str) -> Bus:
            bus = await Bus.connect(nats.url, name=f"demo-{name}")
            await bus.ensure_streams()
            buses.append(bus)
            return bus

        port = SimClusterPort(cluster)
        stages = await pipeline.start_services(
            connect=connect,
            port=port,
            clock=clock,
            profile=config.profile,
            world=shape,
            stopping=stopping,
            plan_interval_wall_s=config.plan_interval_wall_s,
            forecast_interval_wall_s=config.forecast_interval_wall_s,
        )
        tasks.extend(stages.tasks)
        await stages.wait_ready(timeout=60.0)

        if config.real_trainers:
            fleet = TrainingFleet(
                nats_url=nats.url,
                log_dir=config.out / "logs",
                min_task_seconds=config.min_task_seconds,
                data_dir=config.out / "data",
            )
            for job in shape.jobs:
                await fleet.start_job(job.name, pservers=job.pservers)
            for job_name, pods in ready_trainer_pods(cluster, shape).items():
                await fleet.reconcile(job_name, pods)
            # Time starts once every job trains (Python processes take seconds to start on a
            # busy machine; a frozen clock keeps that out of the simulated day).
            deadline = time.monotonic() + config.trainer_start_timeout_wall_s
            while time.monotonic() < deadline:
                running = sum(
                    1
                    for job in shape.jobs
                    if event_log.job_progress.get(job.name, {}).get("applied_total", 0) > 0
                )
                progress(f"starting: {running}/{len(shape.jobs)} training jobs running")
                if running == len(shape.jobs):
                    break
                fleet.reap()
                if fleet.crashed:
                    raise RuntimeError(
                        f"a training process exited at start; see {config.out / 'logs'}"
                    )
                await asyncio.sleep(0.5)

        clock.run()
        meter = Meter(shape, start=clock.start, sample_every_s=max(60.0, config.hours * 3600 / 600))
        duration = config.hours * 3600.0
        next_progress = 0.0
        while True:
            now = min(clock.now(), clock.start + duration)
            cluster.step(now)
            demand = config.profile.rate(now - clock.start)
            meter.record(now, cluster, demand)
            if fleet is not None:
                fleet.reap()
                for job_name, pods in ready_trainer_pods(cluster, shape).items():
                    await fleet.reconcile(job_name, pods)
            wall = time.monotonic()
            if wall >= next_progress:
                next_progress = wall + config.progress_every_wall_s
                progress(
                    progress_line(
                        now - clock.start,
                        demand=demand,
                        cluster=cluster,
                        shape=shape,
                        meter=meter,
                        fleet=fleet,
                    )
                )
            for task in tasks:
                if task.done() and not task.cancelled() and task.exception() is not None:
                    raise RuntimeError(f"a demo service failed: {task.exception()!r}")
            if now >= clock.start + duration:
                break
            await asyncio.sleep(config.tick_wall_s)

        churn = cluster.counters.pods_bound.get("training", 0) + cluster.counters.pods_stopped.get(
            "training", 0
        )
        summary = summarize(meter, end=clock.start + duration, trainer_churn=churn, wall_s=0.0)
    finally:
        stopping.set()
        if fleet is not None:
            await fleet.stop_all()
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(BaseException):
                await task
        for bus in buses:
            with contextlib.suppress(Exception):
                await bus.close()
        await asyncio.to_thread(nats.stop)
    summary.wall_s = time.monotonic() - started_wall
    summary.training = dict(event_log.job_progress)
    summary.events = dict(sorted(event_log.counts.items()))
    if fleet is not None:
        summary.processes = {
            "started": fleet.started,
            "stopped": fleet.stopped,
            "crashed": fleet.crashed,
        }
    return summary, meter, event_log
