"""`tideshift demo --cluster kubeconfig`: the same day against a real Kubernetes API server.

What runs, all on this machine:
* the cluster: `$KUBECONFIG`, a kubeconfig path, or the local control plane of
  `tideshift dev cluster up` (started for the run when its Go-built binaries are there);
* a serving Deployment and elastic training Jobs created in a fresh namespace (on kwok nodes
  the pods are bookkeeping only, so the real work runs here, as processes that follow them);
* the sample serving app (`tideshift serve-sample`, one process, sized never to shed: the
  serving shortfall is measured as in the sim, against ready replicas x per-replica capacity);
* the load generator sending real HTTP to it at the profile's rate, the profile compressed
  `--speed` times (a day in minutes), and a real Prometheus scraping the app every second;
* every service as its own `tideshift run <service>` process over the embedded NATS: watcher
  and executor on the API server, predictor on Prometheus, planner; coordinators, pservers and
  one trainer process per ready trainer pod.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import shutil
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tideshift.loadgen.core.profiles import RateProfile
from tideshift.loadgen.driver import DriverConfig, LoadStats, drive
from tideshift.services.cluster.port import ClusterPort
from tideshift.services.common.embedded_nats import EmbeddedNats
from tideshift.services.common.ports import free_port
from tideshift.services.demo.clock import DEFAULT_START
from tideshift.services.demo.errors import DemoError
from tideshift.services.demo.figures import ListedFigures
from tideshift.services.demo.fleet import TrainingFleet
from tideshift.services.demo.kube_machine import (
    STARTUP_TIMEOUT_S,
    Children,
    ClusterAccess,
    backfill_prometheus,
    history_openmetrics,
    prometheus_config,
    require_prometheus,
    resolve_cluster,
    tideshift,
    wait_http,
)
from tideshift.services.demo.kube_objects import APP, KUBE_JOBS, KUBE_SERVING, create_objects
from tideshift.services.demo.meter import Meter
from tideshift.services.demo.report import DemoSummary, format_table, plot, summarize, write_json
from tideshift.services.demo.simdemo import EventLog
from tideshift.services.demo.world import JobShape, ServingShape, WorldShape

log = logging.getLogger("tideshift.demo.kube")

# ---- the run ---------------------------------------------------------------------------------


def _service_argv(
    name: str,
    *,
    nats_url: str,
    kubeconfig: Path,
    prometheus_url: str,
    shape: WorldShape,
) -> list[str]:
    from tideshift.services.demo import pipeline

    namespace = shape.serving.namespace
    common = ["--nats-url", nats_url, "--health-port", "0", "--instance", f"demo-{name}"]
    if name in ("watcher", "executor"):
        extra = ["--kubeconfig", str(kubeconfig)]
        if name == "watcher":
            extra += ["--namespace", namespace, "--resync-seconds", "30"]
        else:
            extra += ["--managed-targets", json.dumps(pipeline.kube_managed_targets(shape))]
        return tideshift("run", name, *common, *extra)

    return tideshift(
        "run",
        name,
        *common,
        *pipeline.kube_service_args(
            name,
            prometheus_url=prometheus_url,
            namespace=namespace,
            app=APP,
            serving=shape.serving,
            jobs=shape.jobs,
        ),
    )


def run_kube_demo(
    args: argparse.Namespace,
    profile: RateProfile,
    profile_name: str,
    *,
    kubeconfig: str | None,
    progress: Callable[[str], None],
) -> int:
    speed = args.speed or 144.0
    prometheus = require_prometheus()
    access = resolve_cluster(kubeconfig)
    out: Path = args.out
    children = Children(out / "logs")
    nats = EmbeddedNats(port=args.nats_port)
    try:
        nats.start()
        run = _KubeDemoRun(
            args,
            access=access,
            nats=nats,
            children=children,
            prometheus=prometheus,
            profile=profile,
            profile_name=profile_name,
            speed=speed,
            progress=progress,
        )
        summary_text = asyncio.run(run.run())
    finally:
        children.stop()
        nats.stop()
        if access.started is not None:
            access.started.stop()
    print(summary_text)
    return 0


@dataclass(frozen=True)
class _DemoNamespace:
    """The run's fresh namespace, the world shape placed in it, and the client that made it."""

    api_client: Any
    name: str
    shape: WorldShape


class _KubeDemoRun:
    """One real-cluster demo: set the stage, follow the day, write what was measured."""

    def __init__(
        self,
        args: argparse.Namespace,
        *,
        access: ClusterAccess,
        nats: EmbeddedNats,
        children: Children,
        prometheus: str,
        profile: RateProfile,
        profile_name: str,
        speed: float,
        progress: Callable[[str], None],
    ) -> None:
        self.args = args
        self.out: Path = args.out
        self.access = access
        self.nats = nats
        self.children = children
        self.prometheus = prometheus
        self.profile = profile
        self.profile_name = profile_name
        self.speed = speed
        self.progress = progress
        self.event_log = EventLog(self.out / "events.jsonl")

    async def run(self) -> str:
        """The outline: cluster objects, sample app, Prometheus, services, trainers, the day."""
        from tideshift.services.cluster.kubernetes import KubernetesClusterPort

        namespace = await self._create_namespace()
        app_port = await self._start_sample_app(namespace.shape.serving)
        prometheus_url = await self._start_prometheus(app_port)
        log_ready = asyncio.Event()
        log_task = asyncio.create_task(self.event_log.follow(self.nats.url, log_ready))
        await asyncio.wait_for(log_ready.wait(), 10)
        self._start_services(namespace.shape, prometheus_url)
        fleet = TrainingFleet(
            nats_url=self.nats.url, log_dir=self.out / "logs", data_dir=self.out / "data"
        )
        for job in namespace.shape.jobs:
            await fleet.start_job(job.name, pservers=1)
        port = await asyncio.to_thread(
            KubernetesClusterPort.from_kubeconfig, self.access.kubeconfig
        )
        await self._wait_for_first_forecast_and_plan()
        stop = asyncio.Event()
        load = asyncio.create_task(drive(self.profile, self._load_config(app_port), stop=stop))
        day = _DayFollower(namespace.shape, port=port, fleet=fleet, children=self.children)
        meter = Meter(
            namespace.shape,
            start=DEFAULT_START,
            sample_every_s=max(60.0, self.args.hours * 3600 / 600),
        )
        started = time.monotonic()
        try:
            while not load.done():
                elapsed = time.monotonic() - started
                profile_time = min(elapsed * self.speed, self.args.hours * 3600)
                self.progress(await day.tick(profile_time, self.profile, meter))
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(asyncio.shield(load), 1.0)
            stats: LoadStats = load.result()
        finally:
            stop.set()
            await fleet.stop_all()
            log_task.cancel()
            with contextlib.suppress(BaseException):
                await log_task
            await port.close()
            await _delete_namespace(namespace)
        summary = summarize(
            meter,
            end=DEFAULT_START + self.args.hours * 3600,
            trainer_churn=day.churn,
            wall_s=time.monotonic() - started,
        )
        return self._write_outputs(summary, meter, stats)

    async def _create_namespace(self) -> _DemoNamespace:
        from kubernetes import config as kube_config

        name = f"tideshift-demo-{uuid.uuid4().hex[:6]}"
        serving = ServingShape(**{**KUBE_SERVING.__dict__, "namespace": name})
        jobs = tuple(JobShape(**{**job.__dict__, "namespace": name}) for job in KUBE_JOBS)
        shape = WorldShape(nodes=0, serving=serving, jobs=jobs)
        kubeconfig = self.access.kubeconfig
        try:
            api_client = kube_config.new_client_from_config(  # type: ignore[no-untyped-call]
                config_file=str(kubeconfig)
            )
            await asyncio.to_thread(
                create_objects, api_client, name, shape, initial_demand_rps=self.profile.rate(0.0)
            )
        except Exception as error:
            raise DemoError(
                f"cannot use the cluster in {kubeconfig} ({type(error).__name__}: "
                f"{str(error).splitlines()[0] if str(error) else ''}); is it running? "
                "`tideshift dev cluster status`"
            ) from None
        return _DemoNamespace(api_client, name, shape)

    async def _start_sample_app(self, serving: ServingShape) -> int:
        """The sample app's port, once it answers."""
        app_port = free_port()
        self.children.start(
            "sample-app",
            tideshift(
                "serve-sample",
                "--app",
                APP,
                "--port",
                str(app_port),
                "--capacity-rps",
                str(serving.capacity_rps * serving.max_replicas * 2),
            ),
        )
        await asyncio.to_thread(
            wait_http, f"http://127.0.0.1:{app_port}/healthz", timeout=30, what="the sample app"
        )
        return app_port

    async def _start_prometheus(self, app_port: int) -> str:
        """Prometheus with the backfilled demand history, scraping the app; its URL when ready."""
        prom_dir = self.out / "prometheus"
        prom_dir.mkdir(parents=True, exist_ok=True)
        (prom_dir / "prometheus.yml").write_text(prometheus_config(app_port))
        promtool = shutil.which("promtool") or str(Path(self.prometheus).with_name("promtool"))
        backfill_prometheus(
            promtool,
            prom_dir / "data",
            history_openmetrics(self.profile, speed=self.speed, end_wall=time.time()),
        )
        prom_port = free_port()
        self.children.start(
            "prometheus",
            [
                self.prometheus,
                f"--config.file={prom_dir / 'prometheus.yml'}",
                f"--storage.tsdb.path={prom_dir / 'data'}",
                f"--web.listen-address=127.0.0.1:{prom_port}",
            ],
        )
        prometheus_url = f"http://127.0.0.1:{prom_port}"
        await asyncio.to_thread(
            wait_http, prometheus_url + "/-/ready", timeout=60, what="Prometheus"
        )
        return prometheus_url

    def _start_services(self, shape: WorldShape, prometheus_url: str) -> None:
        for name in ("watcher", "executor", "predictor", "planner"):
            self.children.start(
                name,
                _service_argv(
                    name,
                    nats_url=self.nats.url,
                    kubeconfig=self.access.kubeconfig,
                    prometheus_url=prometheus_url,
                    shape=shape,
                ),
            )

    async def _wait_for_first_forecast_and_plan(self) -> None:
        """The day starts once the pipeline is up: a forecast from Prometheus and a first plan."""
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        wanted = ("io.tideshift.forecast.issued.v1", "io.tideshift.plan.decided.v1")
        while not all(self.event_log.counts.get(kind) for kind in wanted):
            _raise_if_a_child_stopped(self.children)
            if time.monotonic() > deadline:
                raise DemoError(
                    f"the services did not produce a forecast and a plan within "
                    f"{STARTUP_TIMEOUT_S:.0f}s; see the logs in {self.out / 'logs'}"
                )
            self.progress("starting: waiting for the first forecast and plan")
            await asyncio.sleep(0.5)

    def _load_config(self, app_port: int) -> DriverConfig:
        return DriverConfig(
            target=f"http://127.0.0.1:{app_port}/",
            duration_s=self.args.hours * 3600 / self.speed,
            speed=self.speed,
            max_in_flight=512,
            seed=self.args.seed,
        )

    def _write_outputs(self, summary: DemoSummary, meter: Meter, stats: LoadStats) -> str:
        """Plot, summary.txt and summary.json; returns the text to print."""
        summary.training = dict(self.event_log.job_progress)
        summary.events = dict(sorted(self.event_log.counts.items()))
        summary.load = stats.summary()
        table = format_table(summary)
        load_line = (
            f"load: {stats.sent} requests sent ({stats.summary()['offered_rps']} req/s offered, "
            f"target {stats.summary()['target_rps']}), {stats.succeeded} ok, "
            f"{stats.failed} failed, {stats.dropped} dropped, "
            f"p90 latency {stats.percentile(0.9)}"
        )
        text = table + "\n" + load_line
        out = self.out
        plot(meter, out / "demo.png", title=f"tideshift demo (real cluster): {self.profile_name}")
        (out / "summary.txt").write_text(text + "\n")
        write_json(summary, out / "summary.json")
        return text + f"\n\nwrote {out / 'demo.png'}, {out / 'summary.txt'}, {out / 'events.jsonl'}"


class _DayFollower:
    """Each tick of the day: list the cluster, measure, keep a trainer process per ready pod."""

    def __init__(
        self, shape: WorldShape, *, port: ClusterPort, fleet: TrainingFleet, children: Children
    ) -> None:
        self.shape = shape
        self.port = port
        self.fleet = fleet
        self.children = children
        self.churn = 0  # trainer pods that became ready or went away (as `simulate` counts churn)
        self._trainer_pods: dict[str, set[str]] = {}

    async def tick(self, profile_time: float, profile: RateProfile, meter: Meter) -> str:
        """One tick at `profile_time`; returns the progress line."""
        nodes, pods = await asyncio.gather(self.port.list_nodes(), self.port.list_pods())
        figures = ListedFigures(
            nodes,
            [p for p in pods if p.namespace == self.shape.serving.namespace],
            running_is_ready=all(("type", "kwok") in node.labels for node in nodes),
        )
        demand = profile.rate(profile_time)
        meter.record(DEFAULT_START + profile_time, figures, demand)
        self.fleet.reap()
        for job in self.shape.jobs:
            await self._follow_trainers(job, figures)
        _raise_if_a_child_stopped(self.children)
        return self._progress_line(profile_time, demand, figures, meter)

    async def _follow_trainers(self, job: JobShape, figures: ListedFigures) -> None:
        ready = {pod.name for pod in figures.pods if pod.owner == job.ref and figures.is_ready(pod)}
        before = self._trainer_pods.get(job.name, set())
        self.churn += len(ready - before) + len(before - ready)
        self._trainer_pods[job.name] = ready
        await self.fleet.reconcile(job.name, sorted(ready))

    def _progress_line(
        self, profile_time: float, demand: float, figures: ListedFigures, meter: Meter
    ) -> str:
        serving = self.shape.serving
        hours, rest = divmod(profile_time, 3600)
        replicas = figures.ready_count(serving.ref)
        trainers = " ".join(
            f"{j.name}={figures.ready_count(j.ref)}({self.fleet.live_trainers(j.name)})"
            for j in self.shape.jobs
        )
        return (
            f"{int(hours) % 24:02d}:{int(rest // 60):02d} | demand {demand:5.0f} req/s"
            f" | serving {replicas} ready ({replicas * serving.capacity_rps:5.0f} req/s)"
            f" | trainers {trainers} | short {len(meter.accounts.shortfall_minutes)} min"
        )


def _raise_if_a_child_stopped(children: Children) -> None:
    failed = children.failed()
    if failed:
        raise DemoError("a demo process stopped: " + "; ".join(failed))


async def _delete_namespace(namespace: _DemoNamespace) -> None:
    """Best effort: the run's objects go with their namespace."""
    with contextlib.suppress(Exception):
        from kubernetes import client

        await asyncio.to_thread(
            client.CoreV1Api(namespace.api_client).delete_namespace, namespace.name
        )
