"""Starts the production services in-process with the demo's ports (sim cluster, sim clock).

Each service gets its own bus connection and its own `ServiceContext`, and runs the same
component its `tideshift run <service>` runs; only the adapters differ.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from tideshift.loadgen.profiles import RateProfile
from tideshift.services.cluster.port import ClusterPort
from tideshift.services.common.bus import Bus
from tideshift.services.common.runtime import ServiceContext
from tideshift.services.common.settings import ServiceSettings
from tideshift.services.demo.clock import SimClock
from tideshift.services.demo.world import JobShape, ServingShape, WorldShape
from tideshift.services.executor import service as executor_service
from tideshift.services.planner import service as planner_service
from tideshift.services.predictor import service as predictor_service
from tideshift.services.predictor import sources
from tideshift.services.watcher import watcher as watcher_module

log = logging.getLogger("tideshift.demo.pipeline")

# Forecasts on a 5-minute grid, two hours ahead, fitted on a week of history before the run
# (the sim source answers for any time), refitted every six simulated hours.
FORECAST_STEP_S = 300.0
FORECAST_HORIZON_S = 2 * 3600.0
FORECAST_HISTORY_S = 7 * 86400.0
FORECAST_REFIT_S = 6 * 3600.0


@dataclass
class Stages:
    contexts: list[ServiceContext] = field(default_factory=list)
    tasks: list[asyncio.Task[None]] = field(default_factory=list)

    async def wait_ready(self, *, timeout: float) -> None:
        async def one(context: ServiceContext) -> None:
            await context.ready.wait()

        waits = [asyncio.ensure_future(one(context)) for context in self.contexts]
        _, pending = await asyncio.wait(waits, timeout=timeout)
        for future in pending:
            future.cancel()
        for task in self.tasks:
            if task.done() and not task.cancelled() and task.exception() is not None:
                raise RuntimeError(f"service {task.get_name()} failed: {task.exception()!r}")
        if pending:
            late = [c.name for c in self.contexts if not c.ready.is_set()]
            raise RuntimeError(f"services not ready after {timeout:.0f}s: {', '.join(late)}")


async def start_services(
    *,
    connect: Callable[[str], Awaitable[Bus]],
    port: ClusterPort,
    clock: SimClock,
    profile: RateProfile,
    world: WorldShape,
    stopping: asyncio.Event,
    plan_interval_wall_s: float,
    forecast_interval_wall_s: float,
) -> Stages:
    stages = Stages()

    def context(name: str, bus: Bus, settings: ServiceSettings | None = None) -> ServiceContext:
        ctx = ServiceContext(
            name=name,
            settings=settings or ServiceSettings(health_port=-1),
            bus=bus,
            instance=f"demo-{name}",
            stopping=stopping,
        )
        stages.contexts.append(ctx)
        return ctx

    # -- watcher: sim cluster -> cluster events and the snapshot
    watcher_bus = await connect("watcher")
    watcher = watcher_module.Watcher(port, watcher_bus, clock=clock.datetime)
    watcher_context = context("watcher", watcher_bus)
    stages.tasks.append(asyncio.create_task(watcher.run(watcher_context.ready), name="watcher"))

    # -- executor: scale commands -> the sim cluster -> scale results
    executor_bus = await connect("executor")
    executor = await executor_service.build_executor(
        executor_bus,
        port,
        name="executor-demo",
        bucket="tideshift_executor_demo",
        dry_run=False,
        max_step=0,
    )
    executor.clock = clock.datetime
    executor_context = context("executor", executor_bus)
    stages.tasks.append(
        asyncio.create_task(
            executor_service.consume(
                executor,
                executor_bus,
                durable="tideshift-executor-demo",
                stopping=stopping,
                ready=executor_context.ready,
            ),
            name="executor",
        )
    )

    # -- predictor and planner, in-process with the simulated clock and metric source injected
    await _start_predictor(
        stages,
        connect=connect,
        context=context,
        clock=clock,
        profile=profile,
        world=world,
        interval_wall_s=forecast_interval_wall_s,
    )
    await _start_planner(
        stages,
        connect=connect,
        context=context,
        clock=clock,
        world=world,
        interval_wall_s=plan_interval_wall_s,
    )
    return stages


async def _start_predictor(
    stages: Stages,
    *,
    connect: Callable[[str], Awaitable[Bus]],
    context: Callable[[str, Bus, ServiceSettings | None], ServiceContext],
    clock: SimClock,
    profile: RateProfile,
    world: WorldShape,
    interval_wall_s: float,
) -> None:
    """The predictor reads demand from the traffic profile at simulated time (its `sim` source)."""
    serving = world.serving
    settings = predictor_service.PredictorSettings(
        health_port=-1,
        metric_source="sim",
        workloads=[predictor_service.WorkloadQuery(namespace=serving.namespace, name=serving.name)],
        step_seconds=FORECAST_STEP_S,
        horizon_seconds=FORECAST_HORIZON_S,
        history_seconds=FORECAST_HISTORY_S,
        refit_seconds=FORECAST_REFIT_S,
        refresh_seconds=interval_wall_s,
    )
    start = clock.start

    def demand(unix_seconds: float) -> float:
        return profile.rate(unix_seconds - start)

    bus = await connect("predictor")
    ctx = context("predictor", bus, settings)
    stages.tasks.append(
        asyncio.create_task(
            predictor_service.run(
                settings, ctx, clock=clock, source=sources.SimMetricSource(demand)
            ),
            name="predictor",
        )
    )


async def _start_planner(
    stages: Stages,
    *,
    connect: Callable[[str], Awaitable[Bus]],
    context: Callable[[str, Bus, ServiceSettings | None], ServiceContext],
    clock: SimClock,
    world: WorldShape,
    interval_wall_s: float,
) -> None:
    """The planner, with the world's serving workload and elastic jobs as its settings."""
    settings = planner_service.PlannerSettings(
        health_port=-1,
        **planner_targets(world, planner_service, speed=clock.speed),
        **planner_timing(speed=clock.speed, interval_wall_s=interval_wall_s),
    )
    bus = await connect("planner")
    ctx = context("planner", bus, settings)
    planner = planner_service.Planner(
        bus, settings, ctx.instance, ctx.stopping, ctx.ready, clock=clock
    )
    stages.tasks.append(asyncio.create_task(planner.run(), name="planner"))


# Wall seconds of pipeline delay (forecast -> plan -> command -> executor -> sim) the serving
# margin absorbs; at 288x five wall seconds are 24 simulated minutes.
LAG_BUDGET_WALL_S = 5.0


def planner_targets(world: WorldShape, planner_service: Any, *, speed: float) -> dict[str, Any]:
    """The planner's `serving` and `training` settings for the demo's world."""
    serving = world.serving
    gib = 2.0**30
    return {
        "serving": [
            planner_service.ServingTarget(
                namespace=serving.namespace,
                name=serving.name,
                cpu=serving.cpu,
                memory=serving.memory_gib * gib,
                # the planner's capacity is per replica at its target utilisation
                capacity_rps=serving.capacity_rps * serving.target_utilization,
                min_replicas=serving.min_replicas,
                max_replicas=serving.max_replicas,
                lead_time_s=serving.startup_delay_s,
                margin_s=max(FORECAST_STEP_S, speed * LAG_BUDGET_WALL_S),
                stabilization_s=600.0,
            )
        ],
        "training": [
            planner_service.TrainingTarget(
                kind=job.kind,
                namespace=job.namespace,
                name=job.name,
                cpu=job.trainer_cpu,
                memory=job.trainer_memory_gib * gib,
                min_trainers=job.min_trainers,
                max_trainers=job.max_trainers,
                priority=job.priority,
                weight=job.weight,
                # the sim names a job's parameter servers <job>-ps<n>
                companion_markers=("-ps",),
            )
            for job in world.jobs
        ],
    }


def planner_timing(*, speed: float, interval_wall_s: float) -> dict[str, Any]:
    """Planner windows in clock seconds, scaled so the loop runs every `interval_wall_s`."""
    return {
        "tick_seconds": speed * interval_wall_s,
        "debounce_seconds": speed * min(0.2, interval_wall_s),
        "lease_ttl_seconds": 6.0,  # wall seconds: the lease lives in NATS KV
        "forecast_max_age_seconds": max(600.0, speed * 10.0),
        "cluster_silence_seconds": max(900.0, speed * 60.0),
        "resend_seconds": max(120.0, speed * 5.0),
        "min_trainer_lifetime_seconds": 600.0,
    }


def kube_service_args(
    name: str,
    *,
    prometheus_url: str,
    namespace: str,
    app: str,
    serving: ServingShape,
    jobs: Sequence[JobShape],
) -> list[str]:
    """Flags of `tideshift run predictor|planner` for the real-cluster demo (real time).

    The day is compressed: one wall minute is `speed` simulated minutes, so the demand query
    uses a short rate window and the forecast grid is seconds, not minutes.
    """
    if name == "predictor":
        workloads = [{"namespace": namespace, "name": app}]
        return [
            "--metric-source",
            "prometheus",
            "--prometheus-url",
            prometheus_url,
            "--workloads",
            json.dumps(workloads),
            "--query-template",
            'sum(rate(http_requests_total{app="$name"}[10s]))',
            "--step-seconds",
            "5",
            "--horizon-seconds",
            "120",
            "--history-seconds",
            "3600",
            "--refit-seconds",
            "60",
            "--refresh-seconds",
            "2",
            "--stale-after-seconds",
            "30",
        ]
    if name == "planner":
        world = WorldShape(serving=serving, jobs=tuple(jobs))
        targets = planner_targets(world, planner_service, speed=1.0)
        # Real time: pods on kwok nodes start in a second or two; windows are wall seconds.
        serving_targets = [
            target.model_copy(
                update={"lead_time_s": 5.0, "margin_s": 15.0, "stabilization_s": 30.0}
            ).model_dump()
            for target in targets["serving"]
        ]
        training_targets = [
            target.model_copy(update={"companion_markers": ("pserver",)}).model_dump()
            for target in targets["training"]
        ]
        return [
            "--serving",
            json.dumps(serving_targets),
            "--training",
            json.dumps(training_targets),
            "--tick-seconds",
            "2",
            "--debounce-seconds",
            "0.5",
            "--forecast-max-age-seconds",
            "30",
            "--resend-seconds",
            "10",
            "--min-trainer-lifetime-seconds",
            "10",
            "--lease-ttl-seconds",
            "6",
        ]
    raise ValueError(f"no real-cluster settings for the {name} service")
