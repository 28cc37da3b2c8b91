"""Benchmark: the watcher's events, the bus and the planner together, at 5,000 nodes.

Runs a real nats-server (the venv's), the real planner process (`tideshift run planner`) and
an event generator process that runs the watcher's own `Watcher` class (publishing and the
KV snapshot) over a synthetic cluster: Kubernetes-shaped objects (as the apiserver lists
them) converted by the watcher's real conversions (`services/cluster/core/conversions.py`, the
Deployment adapter, the annotation policy), so the events cannot drift from the watcher's.
Only the `ClusterReader` port is synthetic: the local control plane cannot hold 150,000 pods.

Per size (a baseline at 1 % of the size first, then the full size, in the same run):
1. cold list: the generator reconciles every object (one event each, plus the snapshot KV);
2. idle: forecasts for every serving workload (as the predictor publishes them, re-issued
   every 60 s), then forecast jumps -> the planner's ScaleCommand, one at a time;
3. churn: pods created, scheduled and deleted at `--churn-rate` events/s through the watcher
   while the forecast jumps go on.

Prints: whether the generator kept the churn rate (its lag behind schedule), the bytes the
server held for the planner (its backlog) and the planner's CPU, plan p50/p99 (plan start to
its PlanDecided on the bus, and plan() alone from the planner's histogram), forecast jump ->
ScaleCommand p50/p99 idle and under churn, each process's peak RSS, and ratios to the baseline.

Usage: nice -n 10 .venv/bin/python tests/benchmarks/bench_pipeline_scale.py
    [--nodes 5000 --pods 150000 --serving 500 --jobs 200 --churn-rate 1000 --churn-seconds 60]
    [--planner-cpu 1]  (the planner pinned to core 1 with `taskset`, everything else on the
    other cores, so the figures are the planner's and not the machine's load)
About 6-10 minutes at the default size on a loaded 2-core machine. It asserts nothing about
time; it prints figures.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import math
import os
import socket
import sys
import tempfile
import time
import urllib.request
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

from tests.benchmarks.bench_watch_scale import percentile, summary  # noqa: E402
from tests.k8s.cluster_objects import deployment  # noqa: E402
from tideshift.events import (  # noqa: E402
    FORECAST,
    PLAN_DECIDED,
    SCALE_COMMAND,
    ForecastIssued,
    ForecastPoint,
    PlanDecided,
    ScaleCommand,
    WorkloadRef,
)
from tideshift.services.cluster.adapters.targets import default_adapters  # noqa: E402
from tideshift.services.cluster.core.conversions import (  # noqa: E402
    node_from_object,
    pod_from_object,
    workload_from_object,
)
from tideshift.services.cluster.port import ClusterChange, Node, Pod, Workload  # noqa: E402
from tideshift.services.common.bus import Bus  # noqa: E402
from tideshift.services.common.embedded_nats import EmbeddedNats  # noqa: E402
from tideshift.services.predictor.core.forecasting import grid  # noqa: E402
from tideshift.services.watcher.watcher import Watcher  # noqa: E402

NAMESPACE = "bench"
KIND = "Deployment.apps"
CAPACITY_RPS = 10.0
WAIT_S = 60.0
JUMP_INTERVAL_S = 0.25  # at most four forecast jumps a second


# -- the synthetic cluster, as the apiserver would list it --------------------------------


@dataclass(frozen=True)
class Size:
    nodes: int
    pods: int
    serving: int
    jobs: int

    @property
    def serving_replicas(self) -> int:  # a fifth of the pods serve
        return max(1, self.pods // 5 // self.serving)

    @property
    def trainers(self) -> int:  # a tenth train
        return max(1, self.pods // 10 // max(self.jobs, 1))

    @property
    def others(self) -> int:
        return self.pods - self.serving * self.serving_replicas - self.jobs * self.trainers

    def scaled(self, factor: float) -> Size:
        return Size(
            nodes=max(1, round(self.nodes * factor)),
            pods=max(10, round(self.pods * factor)),
            serving=max(1, round(self.serving * factor)),
            jobs=max(1, round(self.jobs * factor)),
        )

    def label(self) -> str:
        return (
            f"{self.nodes:,} nodes, {self.pods:,} pods, {self.serving} serving workloads "
            f"({self.serving_replicas} replicas each), {self.jobs} training jobs "
            f"({self.trainers} trainers each)"
        )


def node_object(index: int, version: int) -> dict[str, Any]:
    return {
        "metadata": {
            "name": f"node-{index:05d}",
            "labels": {"kubernetes.io/hostname": f"node-{index:05d}", "pool": f"p{index % 4}"},
            "resourceVersion": str(version),
        },
        "spec": {},
        "status": {
            "allocatable": {"cpu": "64", "memory": "256Gi", "pods": "110"},
            "conditions": [{"type": "Ready", "status": "True"}],
        },
    }


def workload_object(name: str, replicas: int, role: str, version: int) -> dict[str, Any]:
    annotations = (
        {
            "tideshift.io/capacity-rps": str(CAPACITY_RPS),
            "tideshift.io/max-replicas": "5000",  # room for every jump up
        }
        if role == "serving"
        else {"tideshift.io/min-replicas": "1", "tideshift.io/max-replicas": str(replicas)}
    )
    obj = deployment(name, replicas, role=role, cpu="250m", annotations=annotations)
    obj["metadata"].update(
        namespace=NAMESPACE,
        uid=f"uid-{name}",
        resourceVersion=str(version),
        labels={"app": name, "tideshift.io/role": role},
    )
    obj["status"] = {"replicas": replicas, "readyReplicas": replicas}
    return obj


def pod_object(
    name: str, owner: str | None, role: str, node: str | None, version: int
) -> dict[str, Any]:
    metadata: dict[str, Any] = {
        "name": name,
        "namespace": NAMESPACE,
        "uid": f"uid-{name}",
        "labels": {"tideshift.io/role": role} if role != "other" else {"app": "other"},
        "resourceVersion": str(version),
        "creationTimestamp": "2026-11-25T00:00:00Z",
    }
    if owner is not None:
        metadata["ownerReferences"] = [
            {
                "apiVersion": "apps/v1",
                "kind": "ReplicaSet",
                "name": f"{owner}-rs",
                "controller": True,
            }
        ]
    spec = {
        "containers": [{"name": "main", "image": "x", "resources": {"requests": {"cpu": "250m"}}}],
        "nodeName": node,
    }
    status = {
        "phase": "Running" if node else "Pending",
        "conditions": [{"type": "Ready", "status": "True" if node else "False"}],
    }
    return {"metadata": metadata, "spec": spec, "status": status}


def resolve_owner(namespace: str, reference: Mapping[str, Any]) -> WorkloadRef | None:
    """The informer's ReplicaSet -> Deployment lookup, answered from the names used here."""
    return WorkloadRef(namespace, KIND, str(reference["name"]).removesuffix("-rs"))


class SyntheticCluster:
    """The watcher's `WatchedCluster` port over generated objects; `watch` is the churn."""

    def __init__(self, size: Size, churn_rate: float, churn_seconds: float) -> None:
        self.size, self.rate, self.seconds = size, churn_rate, churn_seconds
        self.version = itertools.count(1)
        self.stats: dict[str, float] = {}

    def _node(self, index: int) -> str:
        return f"node-{index % self.size.nodes:05d}"

    async def list_nodes(self) -> list[Node]:
        return [
            node_from_object(node_object(i, next(self.version))) for i in range(self.size.nodes)
        ]

    async def list_pods(self) -> list[Pod]:
        size, pods = self.size, []
        owned = [(f"web-{w}", "serving", size.serving_replicas) for w in range(size.serving)]
        owned += [(f"job-{j}", "training", size.trainers) for j in range(size.jobs)]
        for owner, role, count in owned:
            for r in range(count):
                obj = pod_object(f"{owner}-{r}", owner, role, self._node(len(pods)), 0)
                pods.append(obj)
        pods += [
            pod_object(f"other-{i}", None, "other", self._node(len(pods) + i), 0)
            for i in range(size.others)
        ]
        for obj in pods:
            obj["metadata"]["resourceVersion"] = str(next(self.version))
        return [pod_from_object(obj, resolve_owner) for obj in pods]

    async def list_workloads(self) -> list[Workload]:
        adapter = default_adapters()[KIND]
        size = self.size
        objects = [
            workload_object(f"web-{w}", size.serving_replicas, "serving", next(self.version))
            for w in range(size.serving)
        ]
        objects += [
            workload_object(f"job-{j}", size.trainers, "training", next(self.version))
            for j in range(size.jobs)
        ]
        return [workload_from_object(adapter, obj) for obj in objects]

    def unwatched(self) -> list[str]:
        return []

    async def record_event(self, target: Any, *, reason: str, message: str) -> None:
        raise AssertionError(f"the generated workloads are valid: {message}")

    def _change(self, step: int) -> ClusterChange:
        """Step 3k creates pod k (Pending), 3k+1 schedules it, 3k+2 deletes it."""
        k, stage = divmod(step, 3)
        name, version = f"churn-{k}", next(self.version)
        node = None if stage == 0 else self._node(k * 7)
        obj = pod_object(name, None, "other", node, version)
        kind = ("added", "modified", "deleted")[stage]
        return ClusterChange(kind, pod_from_object(obj, resolve_owner))

    async def watch(self) -> AsyncIterator[ClusterChange]:
        await asyncio.to_thread(sys.stdin.readline)  # the orchestrator says when to churn
        total = int(self.rate * self.seconds)
        started, worst = time.perf_counter(), 0.0
        for step in range(total):
            due = started + step / self.rate
            behind = time.perf_counter() - due
            worst = max(worst, behind)
            if behind < -0.002:
                await asyncio.sleep(-behind)
            yield self._change(step)
        elapsed = time.perf_counter() - started
        self.stats = {"events": total, "seconds": elapsed, "worst_lag_s": worst}


async def generate(args: argparse.Namespace) -> None:
    """The generator process: the watcher's class over the synthetic port."""
    size = Size(args.nodes, args.pods, args.serving, args.jobs)
    port = SyntheticCluster(size, args.churn_rate, args.churn_seconds)
    bus = await Bus.connect(args.nats_url, name="bench-generator")
    watcher = Watcher(port, bus)  # type: ignore[arg-type]
    listed = asyncio.Event()
    started = time.perf_counter()
    task = asyncio.create_task(watcher.run(listed))
    waiting = asyncio.create_task(listed.wait())
    await asyncio.wait({waiting, task}, return_when=asyncio.FIRST_COMPLETED)
    if task.done():  # the watcher failed before its first list: say why
        waiting.cancel()
        task.result()
    print(
        f"GEN listed {watcher.published} events in {time.perf_counter() - started:.1f}s",
        flush=True,
    )
    listed_cpu = time.process_time()  # building the objects included: an upper bound
    await task
    await bus.flush()
    churn_cpu = time.process_time() - listed_cpu
    stats = dict(port.stats, published=watcher.published, list_cpu_s=listed_cpu)
    stats["churn_cpu_s"] = churn_cpu
    print(f"GEN churn {json.dumps(stats)}", flush=True)
    await bus.close()


# -- plan() alone, in this process -------------------------------------------------------


def plan_cpu(args: argparse.Namespace) -> None:
    """The planner's own state and policy over the same synthetic cluster (the watcher's
    conversions to events), without the bus: CPU seconds (`time.process_time`, so other
    processes' load does not count) of copying the inputs and of plan(), per forecast shape."""
    from tideshift.services.planner.core.baselines import make_policy
    from tideshift.services.planner.core.state import PlannerState
    from tideshift.services.planner.settings import PlannerSettings
    from tideshift.services.watcher.core.annotations import workload_event
    from tideshift.services.watcher.core.snapshot import node_event, pod_event

    size = Size(args.nodes, args.pods, args.serving, args.jobs)
    port = SyntheticCluster(size, 0.0, 0.0)
    settings = PlannerSettings(health_port=-1)
    now_at = datetime.now(UTC)
    state = PlannerState(settings.state_config(), started_at=now_at.timestamp())
    lists = [port.list_nodes(), port.list_workloads(), port.list_pods()]
    nodes, workloads, pods = (asyncio.run(listing) for listing in lists)
    for node in nodes:
        state.apply_node(node_event("added", node, observed_at=now_at), now_at.timestamp())
    for workload in workloads:
        event = workload_event("added", workload, observed_at=now_at)
        state.apply_workload(event, now_at.timestamp())
    for pod in pods:
        state.apply_pod(pod_event("added", pod, observed_at=now_at), now_at.timestamp())
    print(f"== plan() CPU alone: {size.label()}", flush=True)
    for shape in ("grid", "unaligned"):
        FORECAST_TIMES["grid"] = shape == "grid"
        for w in range(size.serving):
            level = CAPACITY_RPS * size.serving_replicas
            state.apply_forecast(forecast(f"web-{w}", level), time.time())
        policy = make_policy(settings.policy)
        policy_state = policy.initial_state()
        copies, plans = [], []
        for _ in range(args.plans):
            now = time.time()
            started = time.process_time()
            inputs = state.inputs(now, state.targets({}, now))
            copied = time.process_time()
            _, policy_state = policy.plan(inputs, policy_state, now)
            plans.append(time.process_time() - copied)
            copies.append(copied - started)
        print(summary(f"   forecasts on {shape} times: plan() CPU", plans), flush=True)
        print(summary(f"   forecasts on {shape} times: inputs CPU", copies), flush=True)


# -- the orchestrator ----------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def rss_mib(pid: int) -> float:
    with contextlib.suppress(OSError):
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def cpu_seconds(pid: int) -> float:
    with contextlib.suppress(OSError):
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return 0.0


def http_get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as answer:
        return str(answer.read().decode())


# Forecast points on the predictor's grid (whole steps of the Unix epoch, as its history is
# sampled: `predictor/core/forecasting.py` grid), or (`--forecast-times unaligned`, the shape
# of this benchmark before issue 40) each at its own `issued_at + k steps`: 500 workloads then
# bring 30,000 distinct times into one plan instead of about 61.
FORECAST_TIMES = {"grid": True}
STEP_S = 60.0


def forecast(name: str, rps: float) -> ForecastIssued:
    """The predictor's shape: 60 one-minute steps ahead, ordered quantiles."""
    now = datetime.now(UTC)
    if FORECAST_TIMES["grid"]:
        start = now.timestamp()
        times = [datetime.fromtimestamp(t, UTC) for t in grid(start, start + 60 * STEP_S, STEP_S)]
    else:
        times = [now + timedelta(seconds=STEP_S * k) for k in range(60)]
    return ForecastIssued(
        workload=WorkloadRef(NAMESPACE, KIND, name),
        issued_at=now,
        step_seconds=STEP_S,
        model="portfolio",
        points=tuple(
            ForecastPoint(
                at=at,
                point=rps,
                q50=rps,
                q90=rps * 1.05,
                q95=rps * 1.1,
                q99=rps * 1.2,
            )
            for at in times[:60]
        ),
    )


@dataclass
class Observed:
    """What the planner says on the bus: its plans' durations and its commands."""

    plan_seconds: list[float] = field(default_factory=list)
    plan_targets: int = 0
    plan_bytes: int = 0  # the largest PlanDecided (JSON): a server's max_payload bounds it
    desired: dict[str, int] = field(default_factory=dict)
    arrived: asyncio.Event = field(default_factory=asyncio.Event)

    async def follow_plans(self, bus: Bus) -> None:
        async for envelope in bus.subscribe(PLAN_DECIDED.filter(), consumer="bench-plans"):
            plan: PlanDecided = envelope.data
            self.plan_seconds.append(time.time() - plan.decided_at.timestamp())
            self.plan_targets = len(plan.targets)
            self.plan_bytes = max(self.plan_bytes, len(plan.model_dump_json()))

    async def follow_commands(self, bus: Bus) -> None:
        subject = SCALE_COMMAND.filter(namespace=NAMESPACE)
        async for envelope in bus.subscribe(subject, consumer="bench-commands", buffer=100_000):
            command: ScaleCommand = envelope.data
            self.desired[command.target.name] = command.desired
            self.arrived.set()

    async def until(self, name: str, test: Any) -> int:
        deadline = time.monotonic() + WAIT_S
        while not test(self.desired.get(name)):
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(f"no command for {name} within {WAIT_S:.0f}s")
            self.arrived.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.arrived.wait(), remaining)
        return int(self.desired[name])


class Forecasts:
    """Each serving workload's forecast level, re-issued every minute as the predictor does."""

    def __init__(self, bus: Bus, names: list[str], base: float) -> None:
        self.bus, self.level = bus, dict.fromkeys(names, base)
        self.stopped = asyncio.Event()

    async def publish(self, name: str) -> None:
        subject = FORECAST.at(namespace=NAMESPACE, workload=name)
        await self.bus.publish(subject, forecast(name, self.level[name]))

    async def refresh(self) -> None:
        """Every workload's forecast again at the predictor's cadence (60 s), until stopped."""
        while True:
            for name in list(self.level):
                await self.publish(name)
            if await until(self.stopped, 60.0):
                return


async def until(event: asyncio.Event, timeout_s: float) -> bool:
    """Whether `event` was set within `timeout_s`: a period that ends as soon as asked to."""
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(event.wait(), timeout_s)
    return event.is_set()


async def jumps(
    forecasts: Forecasts, observed: Observed, size: Size, stop: asyncio.Event
) -> tuple[list[float], int]:
    """Forecast jumps -> the ScaleCommand above the workload's last, timed; returns the
    latencies and how many jumps got no command within WAIT_S.

    Each jump adds 10 replicas' worth of demand to one workload, in turn, one every
    JUMP_INTERVAL_S: only up, since scale-down is held by the headroom's memory of the rise
    (by design); paced, so that the baseline's few workloads do not fill its nodes."""
    latencies: list[float] = []
    missed = 0
    for name in itertools.cycle(list(forecasts.level)):
        if stop.is_set():
            break
        last = observed.desired.get(name, size.serving_replicas)
        forecasts.level[name] += 10 * CAPACITY_RPS
        started = time.perf_counter()
        await forecasts.publish(name)
        try:
            await observed.until(name, lambda d, last=last: d is not None and d > last)
        except TimeoutError:
            missed += 1
            continue
        latencies.append(time.perf_counter() - started)
        await asyncio.sleep(max(0.0, started + JUMP_INTERVAL_S - time.perf_counter()))
    return latencies, missed


@dataclass
class Sampler:
    """Peak RSS and CPU time of each process, and the server's backlog for the planner."""

    pids: dict[str, int]
    monitor_url: str
    peak: dict[str, float] = field(default_factory=dict)
    backlog_bytes: int = 0
    slow_consumers: int = 0
    stopped: asyncio.Event = field(default_factory=asyncio.Event)

    def sample(self) -> None:
        for name, pid in self.pids.items():
            self.peak[name] = max(self.peak.get(name, 0.0), rss_mib(pid))
        connz = json.loads(http_get(f"{self.monitor_url}/connz?limit=1000"))
        for conn in connz.get("connections", []):
            if str(conn.get("name", "")).startswith("planner"):
                self.backlog_bytes = max(self.backlog_bytes, int(conn.get("pending_bytes", 0)))
        varz = json.loads(http_get(f"{self.monitor_url}/varz"))
        self.slow_consumers = int(varz.get("slow_consumers", 0))

    async def run(self) -> None:
        """A sample every second until stopped."""
        while True:
            await asyncio.to_thread(self.sample)
            if await until(self.stopped, 1.0):
                return


def plan_histogram(
    metrics_text: str, name: str = "tideshift_planner_plan_seconds"
) -> dict[str, float]:
    """A planner histogram (by default plan() alone): count, mean, share <= 100 ms, p50/p99
    as the upper bound of the bucket they fall in."""
    buckets: list[tuple[float, float]] = []
    total = count = 0.0
    for family in text_string_to_metric_families(metrics_text):
        if family.name != name:
            continue
        for sample in family.samples:
            if sample.name.endswith("_bucket"):
                buckets.append((float(sample.labels["le"]), sample.value))
            elif sample.name.endswith("_sum"):
                total = sample.value
            elif sample.name.endswith("_count"):
                count = sample.value
    buckets.sort()
    under = dict(buckets).get(0.1, 0.0)

    def bound(q: float) -> float:
        return next(le for le, n in buckets if n >= q * count) if count else 0.0

    return {
        "count": count,
        "mean": total / count if count else 0.0,
        "within_100ms": under / count if count else 0.0,
        "p50_le": bound(0.5),
        "p99_le": bound(0.99),
        "max_le": bound(1.0),
    }


def planner_samples(metrics_text: str, name: str) -> dict[str, float]:
    """A planner metric's samples by their `kind` label (counters and gauges)."""
    return {
        sample.labels.get("kind", ""): sample.value
        for family in text_string_to_metric_families(metrics_text)
        if family.name == name
        for sample in family.samples
        if not sample.name.endswith("_created")
    }


async def caught_up(
    health: int, events: int, truth: dict[str, float] | None = None, timeout: float = 900.0
) -> tuple[dict[str, float], float]:
    """Wait until the planner applied `events` node/pod events (its ingest histogram's
    count) and, with `truth`, its last plan saw that many nodes and pods; its view and how
    long that took (inf if not within `timeout`)."""
    started = time.perf_counter()
    while True:
        try:
            text = await asyncio.to_thread(http_get, f"http://127.0.0.1:{health}/metrics")
        except OSError:  # a planner starved of CPU answers late: ask again
            text = ""
        applied = plan_histogram(text, "tideshift_planner_ingest_lag_seconds")["count"]
        view = planner_samples(text, "tideshift_planner_cluster_objects")
        if applied >= events and (truth is None or view == truth):
            return view, time.perf_counter() - started
        if time.perf_counter() - started > timeout:
            return view, math.inf
        await asyncio.sleep(0.5)


@dataclass
class Result:
    size: Size
    cold_list_s: float = 0.0
    generator: dict[str, float] = field(default_factory=dict)
    idle_jumps: list[float] = field(default_factory=list)
    churn_jumps: list[float] = field(default_factory=list)
    plans: list[float] = field(default_factory=list)
    histogram: dict[str, float] = field(default_factory=dict)
    rss: dict[str, float] = field(default_factory=dict)
    backlog_bytes: int = 0
    slow_consumers: int = 0
    planner_cpu: float = 0.0
    planner_start_s: float = 0.0
    missed: int = 0  # forecast jumps without a command within WAIT_S
    # Events the planner's subscriptions dropped (nats-py logs each one as a slow consumer):
    # the planner's view of the cluster misses them until a resync repairs it.
    dropped: int = 0
    ingest: dict[str, float] = field(default_factory=dict)  # event observed -> applied
    inputs: dict[str, float] = field(default_factory=dict)  # copying a plan's inputs
    view: dict[str, float] = field(default_factory=dict)  # nodes and pods the planner sees
    view_after_s: float = math.inf  # churn end -> every event applied, view = truth
    list_applied_s: float = math.inf  # generator start -> the cold list applied by the planner
    cpu: dict[str, float] = field(default_factory=dict)  # the planner's CPU seconds, by phase
    repaired: dict[str, float] = field(default_factory=dict)  # by the snapshot resync


# The planner's core (`--planner-cpu`, key "planner"): set by `pin`, read by `start_planner`.
PINNED: dict[str, int] = {}


def start_planner(nats_url: str, health: int, log: Path) -> Any:
    pinned = ("taskset", "-c", str(PINNED["planner"])) if "planner" in PINNED else ()
    return asyncio.create_subprocess_exec(
        *pinned,
        sys.executable,
        "-c",
        "import sys; from services.cli import main; sys.exit(main())",
        "run",
        "planner",
        "--nats-url",
        nats_url,
        "--health-port",
        str(health),
        "--log-level",
        "WARNING",
        cwd=ROOT,
        stdout=log.open("wb"),
        stderr=asyncio.subprocess.STDOUT,
    )


async def wait_ready(health: int, timeout: float) -> float:
    started = time.perf_counter()
    while True:
        with contextlib.suppress(OSError):
            await asyncio.to_thread(http_get, f"http://127.0.0.1:{health}/readyz")
            return time.perf_counter() - started
        if time.perf_counter() - started > timeout:
            raise TimeoutError(f"planner not ready within {timeout:.0f}s")
        await asyncio.sleep(0.2)


def start_generator(size: Size, args: argparse.Namespace, nats_url: str) -> Any:
    return asyncio.create_subprocess_exec(
        sys.executable,
        __file__,
        "--generator",
        *("--nats-url", nats_url),
        *("--nodes", str(size.nodes), "--pods", str(size.pods)),
        *("--serving", str(size.serving), "--jobs", str(size.jobs)),
        *("--churn-rate", str(args.churn_rate), "--churn-seconds", str(args.churn_seconds)),
        cwd=ROOT,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
    )


async def read_line(process: Any, prefix: str, timeout: float) -> str:
    while True:
        line = await asyncio.wait_for(process.stdout.readline(), timeout)
        if not line:
            raise RuntimeError(f"the generator ended before {prefix!r}")
        text = line.decode().strip()
        if text.startswith(prefix):
            return text[len(prefix) :].strip()


async def measure(size: Size, args: argparse.Namespace, work: Path) -> Result:
    result = Result(size)
    print(f"== {size.label()}", flush=True)
    nats = EmbeddedNats(store_dir=work / f"nats-{size.nodes}")
    nats.start()
    health = free_port()
    planner = await start_planner(nats.url, health, work / f"planner-{size.nodes}.log")
    bus = await Bus.connect(nats.url, name="bench")
    tasks: list[asyncio.Task[Any]] = []
    try:
        print(f"   planner ready in {await wait_ready(health, 300):.1f}s", flush=True)
        observed = Observed()
        tasks += [asyncio.create_task(observed.follow_plans(bus))]
        tasks += [asyncio.create_task(observed.follow_commands(bus))]
        generator = await start_generator(size, args, nats.url)
        assert nats._process is not None
        pids = {"planner": planner.pid, "nats-server": nats._process.pid}
        sampler = Sampler(pids | {"generator": generator.pid}, nats.monitor_url)
        tasks.append(asyncio.create_task(sampler.run()))
        started, cpu = time.perf_counter(), cpu_seconds(planner.pid)
        listed = await read_line(generator, "GEN listed", 1800)
        print(f"   the watcher listed and published {listed}", flush=True)
        result.cold_list_s = time.perf_counter() - started
        # Idle means idle: the jumps start once the planner applied the whole cold list.
        objects = size.nodes + size.pods
        _, waited = await caught_up(health, objects)
        result.list_applied_s = result.cold_list_s + waited
        print(f"   the planner applied the cold list {result.list_applied_s:.1f}s", flush=True)
        result.cpu["cold list"] = cpu_seconds(planner.pid) - cpu
        await run_phases(size, args, bus, observed, generator, result, planner.pid)
        result.generator = json.loads(await read_line(generator, "GEN churn", 600))
        await generator.wait()
        events = int(result.generator.get("events", 0))
        # The churn creates, schedules and deletes pod k at steps 3k, 3k+1, 3k+2: an
        # unfinished triple leaves one more pod.
        truth = {"node": float(size.nodes), "pod": float(size.pods + (events % 3 != 0))}
        result.view, result.view_after_s = await caught_up(health, objects + events, truth)
        result.cpu["churn"] = cpu_seconds(planner.pid) - result.cpu.pop("churn start", 0.0)
        sampler.stopped.set()
        await asyncio.to_thread(sampler.sample)
        metrics_text = await asyncio.to_thread(http_get, f"http://127.0.0.1:{health}/metrics")
        result.histogram = plan_histogram(metrics_text)
        result.ingest = plan_histogram(metrics_text, "tideshift_planner_ingest_lag_seconds")
        result.inputs = plan_histogram(metrics_text, "tideshift_planner_inputs_seconds")
        result.repaired = planner_samples(metrics_text, "tideshift_planner_resync_repaired")
        result.planner_cpu = cpu_seconds(planner.pid)
        result.rss, result.backlog_bytes = dict(sampler.peak), sampler.backlog_bytes
        result.slow_consumers = sampler.slow_consumers
        result.planner_start_s = await second_planner(nats.url, work, size)
        log_text = (work / f"planner-{size.nodes}.log").read_text(errors="replace")
        result.dropped = log_text.count("slow consumer, messages dropped")
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await bus.close()
        with contextlib.suppress(ProcessLookupError):
            planner.terminate()
        await asyncio.wait_for(planner.wait(), 30)
        nats.stop()
    report(result)
    return result


async def run_phases(
    size: Size,
    args: argparse.Namespace,
    bus: Bus,
    observed: Observed,
    generator: Any,
    result: Result,
    planner_pid: int,
) -> None:
    names = [f"web-{w}" for w in range(size.serving)]
    forecasts = Forecasts(bus, names, CAPACITY_RPS * size.serving_replicas)
    refresher = asyncio.create_task(forecasts.refresh())
    try:
        # Settle: every workload planned on its forecast (commands for the first ones).
        stop = asyncio.Event()
        idle = asyncio.create_task(jumps(forecasts, observed, size, stop))
        # The idle phase lasts idle_seconds, or ends early if the jumps fail.
        await asyncio.wait({idle}, timeout=args.idle_seconds)
        stop.set()
        result.idle_jumps, result.missed = await asyncio.wait_for(idle, WAIT_S * 2)
        print(f"   idle: {len(result.idle_jumps)} forecast jumps", flush=True)
        idle_plans = len(observed.plan_seconds)
        stop = asyncio.Event()
        result.cpu["churn start"] = cpu_seconds(planner_pid)
        generator.stdin.write(b"go\n")
        await generator.stdin.drain()
        churn = asyncio.create_task(jumps(forecasts, observed, size, stop))
        for second in range(0, int(args.churn_seconds), 10):
            print(f"   churn: {second}s, {len(observed.plan_seconds)} plans so far", flush=True)
            # The churn's window, cut short if the jumps fail (their error surfaces below).
            await asyncio.wait({churn}, timeout=min(10, args.churn_seconds - second))
            if churn.done():
                break
        stop.set()
        result.churn_jumps, missed = await asyncio.wait_for(churn, WAIT_S * 2)
        result.missed += missed
        result.plans = observed.plan_seconds[idle_plans:]
    finally:
        forecasts.stopped.set()
        await asyncio.wait_for(refresher, WAIT_S)


async def second_planner(nats_url: str, work: Path, size: Size) -> float:
    """A planner started on the full snapshot: process start to ready (its bootstrap)."""
    health = free_port()
    process = await start_planner(nats_url, health, work / f"planner2-{size.nodes}.log")
    try:
        return await wait_ready(health, 300)
    except TimeoutError:
        return math.inf  # printed as inf: not ready within 300 s
    finally:
        process.terminate()
        await asyncio.wait_for(process.wait(), 30)


def report(result: Result) -> None:
    gen, size = result.generator, result.size
    rate = gen.get("events", 0) / max(gen.get("seconds", 1e-9), 1e-9)
    kept = gen.get("worst_lag_s", 1e9) < 1.0
    print(
        f"   cold list: {size.nodes + size.pods + size.serving + size.jobs:,} objects "
        f"published by the watcher in {result.cold_list_s:.1f}s"
    )
    print(
        f"   churn: {gen.get('events', 0):,.0f} pod events in {gen.get('seconds', 0):.1f}s = "
        f"{rate:.0f}/s; generator kept up: {'yes' if kept else 'no'} "
        f"(worst lag behind schedule {gen.get('worst_lag_s', 0):.2f}s)"
    )
    print(
        f"   generator CPU (the watcher's class and the synthetic objects): cold list "
        f"{gen.get('list_cpu_s', 0):.1f}s, churn {gen.get('churn_cpu_s', 0):.1f}s"
    )
    total = size.nodes + size.pods + size.serving + size.jobs + gen.get("events", 0)
    print(
        f"   planner kept up: {'yes' if result.dropped == 0 else 'NO'}: its subscriptions "
        f"dropped {result.dropped:,} of {total:,.0f} cluster events (slow consumer)"
    )
    ingest = result.ingest
    print(
        f"   planner ingest lag (watcher observed -> applied, {ingest.get('count', 0):,.0f} "
        f"events): mean {ingest.get('mean', 0) * 1000:.1f} ms, p50 <= "
        f"{ingest.get('p50_le', 0) * 1000:.0f} ms, p99 <= {ingest.get('p99_le', 0) * 1000:.0f} ms, "
        f"max <= {ingest.get('max_le', 0) * 1000:.0f} ms"
    )
    print(
        f"   the planner applied the cold list {result.list_applied_s:.1f}s after it began "
        f"(for {result.cpu.get('cold list', 0):.1f}s of its CPU); every churn event, with its "
        f"view equal to the truth {result.view}, {result.view_after_s:.1f}s after the churn "
        f"(churn: {result.cpu.get('churn', 0):.1f}s of its CPU, plans included); "
        f"repaired by the snapshot resync: {result.repaired or 'none'}"
    )
    print(
        f"   copying a plan's inputs (event loop): mean "
        f"{result.inputs.get('mean', 0) * 1000:.1f} ms, p99 <= "
        f"{result.inputs.get('p99_le', 0) * 1000:.0f} ms"
    )
    print(
        f"   planner's backlog in nats-server: peak {result.backlog_bytes:,} bytes; "
        f"slow consumers {result.slow_consumers}; planner CPU {result.planner_cpu:.0f}s in all"
    )
    if result.plans:
        print(summary(f"   plan start -> PlanDecided ({result.plans and 'churn'})", result.plans))
    hist = result.histogram
    print(
        f"   plan() alone (planner histogram, {hist.get('count', 0):.0f} plans): mean "
        f"{hist.get('mean', 0) * 1000:.1f} ms, {hist.get('within_100ms', 0):.1%} within 100 ms, "
        f"p50 <= {hist.get('p50_le', 0) * 1000:.0f} ms, "
        f"p99 <= {hist.get('p99_le', 0) * 1000:.0f} ms"
    )
    for label, values in (("idle", result.idle_jumps), ("churn", result.churn_jumps)):
        if values:
            print(summary(f"   forecast jump -> ScaleCommand ({label})", values))
    print(f"   forecast jumps without a command within {WAIT_S:.0f}s: {result.missed}")
    peaks = ", ".join(f"{name} {mib:.0f} MiB" for name, mib in result.rss.items())
    print(f"   peak RSS: {peaks}")
    print(
        f"   a second planner, started on the full snapshot: ready in {result.planner_start_s:.1f}s"
    )


def ratios(base: Result, full: Result) -> None:
    print(f"== full / baseline ({full.size.nodes} / {base.size.nodes} nodes)")
    pairs = [("cold list", base.cold_list_s, full.cold_list_s)]
    for q in (50, 99):
        for label, a, b in (
            ("plan start -> PlanDecided", base.plans, full.plans),
            ("jump -> command (churn)", base.churn_jumps, full.churn_jumps),
        ):
            if a and b:
                pairs.append((f"{label} p{q}", percentile(a, q), percentile(b, q)))
    pairs.append(("plan() mean", base.histogram.get("mean", 0), full.histogram.get("mean", 0)))
    pairs += [(f"RSS {n}", base.rss.get(n, 0), full.rss.get(n, 0)) for n in full.rss]
    pairs.append(("second planner ready", base.planner_start_s, full.planner_start_s))
    for label, a, b in pairs:
        print(f"   {label}: {b / a:.2f}x" if a else f"   {label}: baseline 0")


def pin(planner_cpu: int | None) -> None:
    """The planner on `planner_cpu` alone (through `taskset`); this process, nats-server and the
    generator (its children) on every other core. Other sessions' processes are not moved:
    they may still share the planner's core."""
    if planner_cpu is None:
        return
    others = set(os.sched_getaffinity(0)) - {planner_cpu}
    if not others:
        raise SystemExit(f"--planner-cpu {planner_cpu}: no other core left for the rest")
    os.sched_setaffinity(0, others)
    PINNED["planner"] = planner_cpu
    print(
        f"pinned: planner on core {planner_cpu}; orchestrator, nats-server, generator on "
        f"{sorted(others)}",
        flush=True,
    )


async def orchestrate(args: argparse.Namespace) -> None:
    work = Path(tempfile.mkdtemp(prefix="tideshift-pipeline-"))
    pin(args.planner_cpu)
    FORECAST_TIMES["grid"] = args.forecast_times == "grid"
    full = Size(args.nodes, args.pods, args.serving, args.jobs)
    started = time.perf_counter()
    base = await measure(full.scaled(args.baseline_fraction), args, work)
    result = await measure(full, args, work)
    ratios(base, result)
    print(f"total {time.perf_counter() - started:.0f}s; logs in {work}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=5000)
    parser.add_argument("--pods", type=int, default=150_000)
    parser.add_argument("--serving", type=int, default=500, help="serving workloads")
    parser.add_argument("--jobs", type=int, default=200, help="training jobs")
    parser.add_argument("--churn-rate", type=float, default=1000.0, help="pod events/s")
    parser.add_argument("--churn-seconds", type=float, default=60.0)
    parser.add_argument("--idle-seconds", type=float, default=20.0, help="jumps before churn")
    parser.add_argument("--baseline-fraction", type=float, default=0.01, help="baseline size")
    parser.add_argument(
        "--planner-cpu",
        type=int,
        help="the planner alone on this core (taskset); every other process on the others",
    )
    parser.add_argument(
        "--forecast-times",
        choices=("grid", "unaligned"),
        default="grid",
        help="forecast points on the predictor's step grid (as it publishes them) or each "
        "workload's own (this benchmark's shape before issue 40)",
    )
    parser.add_argument(
        "--plan-cpu",
        type=int,
        default=0,
        metavar="PLANS",
        help="instead: time PLANS plans of the planner's state and policy in this process "
        "(CPU seconds, per forecast shape) and stop",
    )
    parser.add_argument("--generator", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--nats-url", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.generator:
        asyncio.run(generate(args))
        return 0
    if args.plan_cpu:
        args.plans = args.plan_cpu
        plan_cpu(args)
        return 0
    load = ", ".join(f"{value:.1f}" for value in os.getloadavg())
    print(f"machine: {os.cpu_count()} cores, load average {load}; python {sys.version.split()[0]}")
    asyncio.run(orchestrate(args))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
