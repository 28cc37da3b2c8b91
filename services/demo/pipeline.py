"""Starts the production services in-process with the demo's ports (sim cluster, sim clock).

Each service gets its own bus connection and its own `ServiceContext`, and runs through the
body its `tideshift run <service>` runs (`serve(settings, context, ...)`) with the same kind
of settings; only the ports differ: the simulated cluster instead of Kubernetes, the traffic
profile instead of Prometheus, the simulated clock instead of the wall clock.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from dataclasses import dataclass, field
from typing import Any

from tideshift.events import EXECUTOR_RECORDS_BUCKET, WorkloadRef
from tideshift.loadgen.core.profiles import RateProfile
from tideshift.services.cluster.port import ClusterPort
from tideshift.services.common.bus import Bus
from tideshift.services.common.runtime import ServiceContext
from tideshift.services.common.settings import ServiceSettings
from tideshift.services.core.constants import HOUR_S, WEEK_S
from tideshift.services.demo.clock import SimClock
from tideshift.services.demo.world import JobShape, ServingShape, WorldShape
from tideshift.services.executor import service as executor_service
from tideshift.services.planner import service as planner_service
from tideshift.services.planner import settings as planner_settings
from tideshift.services.predictor import service as predictor_service
from tideshift.services.predictor import settings as predictor_settings
from tideshift.services.predictor import sources
from tideshift.services.watcher import service as watcher_service

log = logging.getLogger("tideshift.demo.pipeline")

# Forecasts on a 5-minute grid, two hours ahead, fitted on a week of history before the run
# (the sim source answers for any time), refitted every six simulated hours.
FORECAST_STEP_S = 300.0
FORECAST_HORIZON_S = 2 * HOUR_S
FORECAST_HISTORY_S = WEEK_S
FORECAST_REFIT_S = 6 * HOUR_S


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
    """Every service on the demo's ports: watcher and executor on the sim cluster, the
    predictor reading the traffic profile at simulated time, the planner planning the world."""
    stages = Stages()

    async def start(
        name: str,
        settings: ServiceSettings,
        body: Callable[[ServiceContext], Coroutine[Any, Any, None]],
    ) -> None:
        context = ServiceContext(
            name=name,
            settings=settings,
            bus=await connect(name),
            instance=f"demo-{name}",
            stopping=stopping,
        )
        stages.contexts.append(context)
        stages.tasks.append(asyncio.create_task(body(context), name=name))

    watcher_settings = watcher_service.WatcherSettings(health_port=-1)
    await start(
        "watcher",
        watcher_settings,
        lambda context: watcher_service.serve(watcher_settings, context, cluster=port, clock=clock),
    )
    await start(
        "executor",
        EXECUTOR_SETTINGS,
        lambda context: executor_service.serve(
            EXECUTOR_SETTINGS, context, cluster=port, clock=clock
        ),
    )
    predictor_settings = predictor_settings_for(
        world,
        interval_s=clock.speed * forecast_interval_wall_s,
        observe_s=clock.speed * plan_interval_wall_s,
    )
    demand = sources.SimMetricSource(lambda unix_seconds: profile.rate(unix_seconds - clock.start))
    await start(
        "predictor",
        predictor_settings,
        lambda context: predictor_service.serve(
            predictor_settings, context, clock=clock, source=demand
        ),
    )
    planner_settings = planner_settings_for(
        world, speed=clock.speed, interval_wall_s=plan_interval_wall_s
    )
    await start(
        "planner",
        planner_settings,
        lambda context: planner_service.serve(planner_settings, context, clock=clock),
    )
    return stages


# The demo's executor keeps its own durable consumer and record bucket beside a real one's.
EXECUTOR_SETTINGS = executor_service.ExecutorSettings(
    health_port=-1,
    durable="tideshift-executor-demo",
    record_bucket=f"{EXECUTOR_RECORDS_BUCKET}_demo",
)


def predictor_settings_for(
    world: WorldShape, *, interval_s: float, observe_s: float
) -> predictor_settings.PredictorSettings:
    """The predictor's settings: `interval_s` clock seconds between forecasts, `observe_s`
    between observed-demand messages (one per plan, so every plan has a fresh one)."""
    serving = world.serving
    return predictor_settings.PredictorSettings(
        health_port=-1,
        metric_source="sim",
        workloads=[
            predictor_settings.WorkloadQuery(namespace=serving.namespace, name=serving.name)
        ],
        step_seconds=FORECAST_STEP_S,
        horizon_seconds=FORECAST_HORIZON_S,
        history_seconds=FORECAST_HISTORY_S,
        refit_seconds=FORECAST_REFIT_S,
        refresh_seconds=interval_s,
        observe_seconds=observe_s,
    )


def planner_settings_for(
    world: WorldShape, *, speed: float, interval_wall_s: float
) -> planner_settings.PlannerSettings:
    """The planner's settings: the world's targets, its loop every `interval_wall_s`."""
    return planner_settings.PlannerSettings(
        health_port=-1,
        **planner_targets(world, speed=speed),
        **planner_timing(speed=speed, interval_wall_s=interval_wall_s),
    )


# Wall seconds of pipeline delay (forecast -> plan -> command -> executor -> sim) the serving
# margin absorbs; at 288x five wall seconds are 24 simulated minutes.
LAG_BUDGET_WALL_S = 5.0


def planner_targets(world: WorldShape, *, speed: float) -> dict[str, Any]:
    """The planner's `serving` and `training` settings for the demo's world."""
    serving = world.serving
    spec = serving.policy(
        margin_s=max(FORECAST_STEP_S, speed * LAG_BUDGET_WALL_S), stabilization_s=600.0
    )
    gib = 2.0**30
    return {
        "serving": [
            planner_settings.ServingTarget.of(
                spec,
                namespace=serving.namespace,
                name=serving.name,
                cpu=serving.cpu,
                memory=serving.memory_gib * gib,
            )
        ],
        "training": [
            planner_settings.TrainingTarget(
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
                batch=job.batch,
            )
            for job in world.jobs
        ],
        "lend_margin": world.lend_margin,
    }


def planner_timing(*, speed: float, interval_wall_s: float) -> dict[str, Any]:
    """Planner windows in clock seconds, scaled so the loop runs every `interval_wall_s`."""
    return {
        "tick_seconds": speed * interval_wall_s,
        "debounce_seconds": speed * min(0.2, interval_wall_s),
        "lease_ttl_seconds": 6.0,  # wall seconds: the lease lives in NATS KV
        "max_forecast_age_s": max(600.0, speed * 10.0),
        # the predictor observes demand once per plan interval; three missed in a row is stale
        "observed_max_age_seconds": 3.0 * speed * interval_wall_s,
        "cluster_silence_seconds": max(900.0, speed * 60.0),
        "resend_seconds": max(120.0, speed * 5.0),
        "min_trainer_lifetime_s": 600.0,
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
    """Flags of `tideshift run predictor|planner` for the real-cluster demo (real time)."""
    if name == "predictor":
        return _kube_predictor_args(prometheus_url=prometheus_url, namespace=namespace, app=app)
    if name == "planner":
        return _kube_planner_args(WorldShape(serving=serving, jobs=tuple(jobs)))
    raise ValueError(f"no real-cluster settings for the {name} service")


def _kube_predictor_args(*, prometheus_url: str, namespace: str, app: str) -> list[str]:
    """The day is compressed: one wall minute is `speed` simulated minutes, so the demand
    query uses a short rate window and the forecast grid is seconds, not minutes."""
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


def kube_managed_targets(world: WorldShape) -> list[str]:
    """The demo's objects, as the executor's `managed_targets`: they join Tideshift through the
    planner's settings, not through a `tideshift.io/role` label on the object."""
    targets = planner_targets(world, speed=1.0)
    return [
        str(WorkloadRef(kind=target.kind, namespace=target.namespace, name=target.name))
        for target in (*targets["serving"], *targets["training"])
    ]


def _kube_planner_args(world: WorldShape) -> list[str]:
    """The world's targets in real time: pods on kwok nodes start in a second or two, so the
    windows are wall seconds."""
    targets = planner_targets(world, speed=1.0)
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
        "--max-forecast-age-s",
        "30",
        "--resend-seconds",
        "10",
        "--min-trainer-lifetime-s",
        "10",
        "--lease-ttl-seconds",
        "6",
    ]
