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
import logging
import math
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from tideshift.loadgen.driver import DriverConfig, LoadStats, drive
from tideshift.loadgen.profiles import RateProfile
from tideshift.services.cluster.port import ClusterPort
from tideshift.services.common.embedded_nats import EmbeddedNats
from tideshift.services.common.ports import free_port
from tideshift.services.demo.clock import DEFAULT_START
from tideshift.services.demo.errors import DemoError
from tideshift.services.demo.figures import ListedFigures
from tideshift.services.demo.fleet import TrainingFleet
from tideshift.services.demo.meter import Meter
from tideshift.services.demo.report import DemoSummary, format_table, plot, summarize, write_json
from tideshift.services.demo.simdemo import EventLog
from tideshift.services.demo.world import JobShape, ServingShape, WorldShape

log = logging.getLogger("tideshift.demo.kube")

APP = "web"
# Sized for the test control plane (3 x 8-core kwok nodes and a GPU node) and for real HTTP on a
# small machine: a day between 40 and 200 req/s, 10 req/s per replica of one core, so serving
# takes ~5 cores at night and ~25 by day, and two jobs of up to 4 two-core trainers the rest.
KUBE_SERVING = ServingShape(
    name=APP,
    namespace="",  # filled with the run's namespace
    cpu=1.0,
    memory_gib=0.5,
    capacity_rps=10.0,
    target_utilization=0.8,
    min_replicas=2,
    max_replicas=30,
    startup_delay_s=0.0,
)
KUBE_JOBS = (
    JobShape(
        "ctr-a",
        trainer_cpu=2.0,
        trainer_memory_gib=2.0,
        max_trainers=4,
        pservers=0,
        kind="StatefulSet",
    ),
    JobShape(
        "ctr-b",
        trainer_cpu=2.0,
        trainer_memory_gib=2.0,
        max_trainers=4,
        pservers=0,
        kind="StatefulSet",
    ),
)


# ---- preflight -------------------------------------------------------------------------------


@dataclass
class ClusterAccess:
    kubeconfig: Path
    started: Any = None  # a LocalCluster this run started (stopped at the end)


def resolve_cluster(kubeconfig: str | None) -> ClusterAccess:
    """The kubeconfig to use; starts the local control plane when nothing else is there."""
    if kubeconfig is not None:
        return ClusterAccess(Path(kubeconfig))
    env = os.environ.get("KUBECONFIG")
    if env and Path(env.split(os.pathsep)[0]).exists():
        return ClusterAccess(Path(env.split(os.pathsep)[0]))
    from tideshift.services.devcluster.cluster import (
        ADMIN_KUBECONFIG,
        ClusterOptions,
        ClusterStartError,
        LocalCluster,
        default_nodes,
        load_state,
        record_alive,
        state_processes,
    )
    from tideshift.services.devcluster.versions import (
        MissingBinariesError,
        cache_root,
        default_bin_dir,
        stale_binaries,
    )

    state_dir = cache_root() / "devcluster"
    state = load_state(state_dir)
    if state is not None and all(record_alive(r) for r in state_processes(state)):
        return ClusterAccess(state_dir / ADMIN_KUBECONFIG)
    bin_dir = default_bin_dir()
    missing = stale_binaries(bin_dir)
    if missing:
        raise DemoError(
            f"no cluster: $KUBECONFIG is unset, no `tideshift dev cluster` is running, and the "
            f"Go-built binaries to start one are missing in {bin_dir} ({', '.join(missing)}); "
            "build them with `make k8s-binaries` (or pass --cluster PATH to a kubeconfig)"
        )
    cluster = LocalCluster(
        ClusterOptions(bin_dir=bin_dir, nodes=default_nodes(4, cpu="8", memory="32Gi"))
    )
    try:
        cluster.start()
    except (MissingBinariesError, ClusterStartError) as error:
        first = str(error).splitlines()[0] if str(error) else type(error).__name__
        raise DemoError(f"could not start the local control plane: {first}") from None
    return ClusterAccess(cluster.kubeconfig_path, started=cluster)


def require_prometheus() -> str:
    found = shutil.which("prometheus")
    if found is None:
        raise DemoError(
            "the real-cluster demo needs Prometheus: install the Debian package "
            "(`sudo apt-get install prometheus`, or `make system-deps`)"
        )
    return found


# ---- child processes -------------------------------------------------------------------------


@dataclass
class Children:
    log_dir: Path
    processes: list[tuple[str, subprocess.Popen[bytes], IO[bytes]]] = field(default_factory=list)

    def start(self, name: str, argv: list[str], *, env: dict[str, str] | None = None) -> None:
        self.log_dir.mkdir(parents=True, exist_ok=True)
        handle = (self.log_dir / f"{name}.log").open("ab")
        # Children run this interpreter, so they import the same installed `tideshift`.
        environment = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
        process = subprocess.Popen(
            argv, stdin=subprocess.DEVNULL, stdout=handle, stderr=handle, env=environment
        )
        self.processes.append((name, process, handle))

    def failed(self) -> list[str]:
        return [
            f"{name} (exit {process.returncode}, log {self.log_dir / (name + '.log')})"
            for name, process, _ in self.processes
            if process.poll() is not None
        ]

    def stop(self, grace: float = 15.0) -> None:
        for _, process, _ in reversed(self.processes):
            if process.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    process.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + grace
        for _, process, handle in self.processes:
            try:
                process.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
            handle.close()


def tideshift(*args: str) -> list[str]:
    return [sys.executable, "-m", "tideshift.services.cli", *args]


def wait_http(url: str, *, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url, timeout=1.0) as answer:
                if answer.status == 200:
                    return
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(0.2)
    raise DemoError(f"{what} did not answer at {url} within {timeout:.0f}s")


STARTUP_TIMEOUT_S = 180.0
HISTORY_DAYS = 3  # compressed days of demand backfilled into Prometheus before the run


def history_openmetrics(
    profile: RateProfile, *, speed: float, end_wall: float, days: int = HISTORY_DAYS
) -> str:
    """The sample app's request counter over the `days` compressed days before `end_wall`.

    A fresh Prometheus knows nothing, and a forecaster fitted on seconds of data guesses
    wildly; real deployments have weeks of history. Wall time t maps to profile time
    (t - end_wall) * speed, the same mapping the load generator uses from the start on.
    """
    span = days * 86_400.0 / speed
    step = max(1.0, round(span / 20_000.0))
    lines = [
        "# HELP http_requests HTTP requests answered by the sample app (backfilled history)",
        "# TYPE http_requests counter",
    ]
    total = 0.0
    t = float(math.floor(end_wall - span))
    while t < end_wall - 1:
        total += profile.rate((t - end_wall) * speed) * step
        lines.append(f'http_requests_total{{app="{APP}",code="200"}} {total:.3f} {t:.0f}')
        t += step
    lines.append("# EOF")
    return "\n".join(lines) + "\n"


def backfill_prometheus(promtool: str, data_dir: Path, metrics: str) -> None:
    source = data_dir.parent / "history.om"
    source.write_text(metrics)
    done = subprocess.run(
        [promtool, "tsdb", "create-blocks-from", "openmetrics", str(source), str(data_dir)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    if done.returncode != 0:
        raise DemoError(f"promtool could not backfill the demand history: {done.stderr[-300:]}")


def prometheus_config(app_port: int) -> str:
    return (
        "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
        "scrape_configs:\n"
        "  - job_name: sample-app\n"
        f"    static_configs:\n      - targets: ['127.0.0.1:{app_port}']\n"
    )


# ---- the cluster objects ---------------------------------------------------------------------


def create_objects(
    api_client: Any, namespace: str, shape: WorldShape, *, initial_demand_rps: float
) -> None:
    from kubernetes import client

    # Manifests as plain dicts (the client serialises them as they are): typed as Any.
    core: Any = client.CoreV1Api(api_client)
    apps: Any = client.AppsV1Api(api_client)
    scheduling: Any = client.SchedulingV1Api(api_client)
    core.create_namespace({"metadata": {"name": namespace}})
    for name, value in (("tideshift-demo-serving", 1000), ("tideshift-demo-training", 0)):
        with contextlib.suppress(client.ApiException):
            scheduling.create_priority_class(
                {
                    "metadata": {"name": name},
                    "value": value,
                    "preemptionPolicy": "PreemptLowerPriority",
                }
            )
    serving = shape.serving
    labels = {"app": serving.name, "tideshift.io/role": "serving"}
    apps.create_namespaced_deployment(
        namespace,
        {
            "metadata": {
                "name": serving.name,
                "annotations": {
                    "tideshift.io/min-replicas": str(serving.min_replicas),
                    "tideshift.io/max-replicas": str(serving.max_replicas),
                },
            },
            "spec": {
                "replicas": serving.need(initial_demand_rps),
                "selector": {"matchLabels": {"app": serving.name}},
                "template": {
                    "metadata": {"labels": labels},
                    "spec": _pod_spec(
                        "tideshift-demo-serving", serving.cpu, serving.memory_gib, "sample-app"
                    ),
                },
            },
        },
    )
    for job in shape.jobs:
        # A StatefulSet of trainers (stable names, parallel start): kwok completes Job pods at
        # once, and elastic trainers are long-running members anyway.
        apps.create_namespaced_stateful_set(
            namespace,
            {
                "metadata": {
                    "name": job.name,
                    "annotations": {
                        "tideshift.io/min-replicas": str(job.min_trainers),
                        "tideshift.io/max-replicas": str(job.max_trainers),
                    },
                },
                "spec": {
                    "replicas": job.min_trainers,
                    "serviceName": job.name,
                    "podManagementPolicy": "Parallel",
                    "selector": {"matchLabels": {"job": job.name}},
                    "template": {
                        "metadata": {"labels": {"job": job.name, "tideshift.io/role": "training"}},
                        "spec": _pod_spec(
                            "tideshift-demo-training",
                            job.trainer_cpu,
                            job.trainer_memory_gib,
                            "trainer",
                        ),
                    },
                },
            },
        )


def _pod_spec(priority_class: str, cpu: float, memory_gib: float, container: str) -> dict[str, Any]:
    return {
        "priorityClassName": priority_class,
        "terminationGracePeriodSeconds": 15,
        # kwok nodes carry this taint; real nodes do not, and the toleration is harmless there.
        "tolerations": [
            {"key": "kwok.x-k8s.io/node", "operator": "Exists", "effect": "NoSchedule"}
        ],
        "containers": [
            {
                "name": container,
                "image": "tideshift:demo",
                "resources": {
                    "requests": {
                        "cpu": f"{int(cpu * 1000)}m",
                        "memory": f"{int(memory_gib * 1024)}Mi",
                    }
                },
            }
        ],
    }


# ---- the run ---------------------------------------------------------------------------------


def _service_argv(
    name: str,
    *,
    nats_url: str,
    kubeconfig: Path,
    prometheus_url: str,
    shape: WorldShape,
) -> list[str]:
    namespace = shape.serving.namespace
    common = ["--nats-url", nats_url, "--health-port", "0", "--instance", f"demo-{name}"]
    if name in ("watcher", "executor"):
        extra = ["--kubeconfig", str(kubeconfig)]
        if name == "watcher":
            extra += ["--namespace", namespace, "--resync-seconds", "30"]
        return tideshift("run", name, *common, *extra)
    from tideshift.services.demo import pipeline

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
