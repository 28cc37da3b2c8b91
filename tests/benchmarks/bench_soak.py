"""Benchmark (issue 25 part 4): does memory stay bounded when every consumed subject is flooded
with names nobody announced? For every service, one at a time (`--services`):

* planner and predictor (`tideshift run ...` on a real nats-server; the predictor on its sim
  metric source): workloads announced (`WorkloadChanged`) and then deleted (objects that came
  and went: "after" is what the services keep once they are gone; the peak is what the
  announced ones cost while they existed, at most the predictor's max_announced_workloads),
  forecasts, observed demand and scale results for unknown workloads, pods, and deleted nodes.
  "After" is taken once the predictor forecasts none of the flood's workloads (at most
  `--settle` seconds).
* executor (`tideshift run executor` on the real Kubernetes control plane of tests/k8s, the
  built binaries): scale commands for distinct targets that do not exist (answered `rejected`,
  no record, no Event) and for `--objects` distinct unlabelled StatefulSets (answered
  `rejected` with a Warning Event each: past the Event writer's 4,096 remembered objects).
  Commands are kept at most `WINDOW` ahead of the results, so the budget covers their handling.
* coordinator (`tideshift run coordinator`, no pservers: it waits for them, as a job whose
  pservers are down does): `left` announcements for trainers never seen, then trainers that
  join (a member key) and leave (announced, key deleted).
* watcher (its `Watcher` class in a child process, over a port that streams Kubernetes-shaped
  objects through the watcher's real conversions, as bench_pipeline_scale.py does): distinct
  pods, labelled Deployments and nodes, each added then deleted. After the flood it prints
  the watcher's per-object state (live versions, tombstones, pending snapshot writes) and the
  snapshot's key count, which must be back at their start.

Each subject is published for at most `--budget` seconds (the count actually sent is
printed). RSS of each service (VmRSS from /proc) is printed before the flood, at its peak and
after it, once its RSS stops falling; the goal is "after" within 50 MB of "before".

Usage: nice -n 10 .venv/bin/python tests/benchmarks/bench_soak.py [--names 1000000]
       [--budget 120] [--settle 600] [--only workload] [--objects 5000]
       [--services planner,executor,coordinator,watcher]   (planner: with the predictor)
It asserts nothing; it prints figures.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import linecache
import os
import signal
import subprocess
import sys
import tempfile
import time
import tracemalloc
import urllib.error
import urllib.request
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime
from itertools import count as counting
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from tests.benchmarks.bench_pipeline_scale import (  # noqa: E402
    KIND,
    node_object,
    pod_object,
    resolve_owner,
    workload_object,
)
from tests.k8s.cluster_objects import create, statefulset  # noqa: E402
from tideshift import events  # noqa: E402
from tideshift.services.cluster.adapters.http import KubeHttp  # noqa: E402
from tideshift.services.cluster.adapters.targets import default_adapters  # noqa: E402
from tideshift.services.cluster.core.conversions import (  # noqa: E402
    node_from_object,
    pod_from_object,
    workload_from_object,
)
from tideshift.services.cluster.port import ClusterChange, Node, Pod, Workload  # noqa: E402
from tideshift.services.common.bus import Bus  # noqa: E402
from tideshift.services.common.embedded_nats import EmbeddedNats  # noqa: E402
from tideshift.services.common.ports import free_port  # noqa: E402
from tideshift.services.devcluster.cluster import ClusterOptions, LocalCluster  # noqa: E402
from tideshift.services.devcluster.nodes import default_nodes  # noqa: E402
from tideshift.services.devcluster.versions import default_bin_dir, stale_binaries  # noqa: E402
from tideshift.services.trainer.core.jobspec import MemberBeat  # noqa: E402
from tideshift.services.trainer.port.bus import MEMBER_TTL_SECONDS, member_key  # noqa: E402
from tideshift.services.watcher.watcher import Watcher  # noqa: E402

TIDESHIFT = str(Path(sys.executable).parent / "tideshift")
GOAL_MB = 50.0
NOW = datetime.now(UTC)
WINDOW = 500  # scale commands sent ahead of their results at most
JOB = "soak"


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for {pid}")


def ready(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=2) as answer:
            return bool(answer.status == 200)
    except (urllib.error.URLError, OSError):
        return False


def scrape(port: int) -> list[str] | None:
    """A service's /metrics lines; None when unreachable."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as answer:
            return answer.read().decode().splitlines()
    except OSError:
        return None


def metric(port: int, name: str) -> float | None:
    """An unlabelled sample from a service's /metrics; None when absent or unreachable."""
    lines = scrape(port) or []
    return next((float(line.split()[1]) for line in lines if line.startswith(name + " ")), None)


def backlog(port: int) -> float | None:
    """The messages a service's subscriptions hold, not yet applied (all its consumers)."""
    lines = scrape(port)
    if lines is None:
        return None
    return sum(
        float(line.split()[-1]) for line in lines if line.startswith("tideshift_bus_backlog{")
    )


async def caught_up(ports: dict[str, int], settle_s: float) -> float:
    """Seconds until neither the predictor forecasts nor the planner plans a workload (the
    flood's were all deleted; a dropped deletion waits for its resync with the snapshot) and
    neither holds a message it has not applied (a backlog is memory held, not kept), at most
    `settle_s`."""
    started = time.monotonic()
    while time.monotonic() - started < settle_s:
        predicting = metric(ports["predictor"], "tideshift_predictor_workloads")
        planning = metric(ports["planner"], "tideshift_planner_targets")
        waiting = [backlog(port) for port in ports.values()]
        if predicting == 0 and planning == 0 and waiting == [0.0] * len(ports):
            break
        await asyncio.sleep(0.5)
    return time.monotonic() - started


async def settled_rss(pid: int, *, timeout_s: float) -> None:
    """Until the process's RSS stops falling (two readings 0.5 s apart within 1 MB), at most
    `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    previous = rss_mb(pid)
    while time.monotonic() < deadline:
        await asyncio.sleep(0.5)
        current = rss_mb(pid)
        if previous - current < 1.0:
            return
        previous = current


async def wait_until(check: Callable[[], bool], *, timeout_s: float) -> bool:
    """Whether `check()` became true within `timeout_s` (polled every 0.2 s)."""
    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(0.2)
    return True


def ref(index: int) -> events.WorkloadRef:
    return events.WorkloadRef(kind="Deployment", namespace="soak", name=f"w-{index}")


def _workload(i: int) -> tuple[str, events.EventData]:
    event = events.WorkloadChanged(
        change="added",
        workload=ref(i),
        role="serving",
        replicas=1,
        requests=events.Resources(cpu=0.01),
        serving=events.ServingPolicy(capacity_rps=10),
        observed_at=NOW,
    )
    return events.WORKLOAD_CHANGED.at(
        namespace="soak", kind="Deployment", name=f"w-{i}"
    ).value, event


def _gone(i: int) -> tuple[str, events.EventData]:
    """The announced workload `i` deleted: the flood's objects came and went."""
    subject, event = _workload(i)
    assert isinstance(event, events.WorkloadChanged)
    return subject, event.model_copy(update={"change": "deleted"})


def _forecast(i: int) -> tuple[str, events.EventData]:
    point = events.ForecastPoint(at=NOW, point=1, q50=1, q90=2, q95=3, q99=4)
    event = events.ForecastIssued(
        workload=ref(i), issued_at=NOW, step_seconds=60, model="m", points=(point,)
    )
    return events.FORECAST.at(namespace="soak", workload=f"w-{i}").value, event


def _observed(i: int) -> tuple[str, events.EventData]:
    event = events.DemandObserved(workload=ref(i), rps=5.0, observed_at=NOW)
    return events.DEMAND_OBSERVED.at(namespace="soak", workload=f"w-{i}").value, event


def _result(i: int) -> tuple[str, events.EventData]:
    event = events.ScaleResult(
        target=ref(i), idempotency_key=f"k-{i}", outcome="noop", desired=1, executed_at=NOW
    )
    values = {p: "soak" if p == "namespace" else f"w-{i}" for p in events.SCALE_RESULT.params}
    return events.SCALE_RESULT.at(**values).value, event


def _pod(i: int) -> tuple[str, events.EventData]:
    event = events.PodChanged(
        change="deleted", namespace="soak", name=f"p-{i}", phase="Running", observed_at=NOW
    )
    return events.POD_CHANGED.at(namespace="soak", name=f"p-{i}").value, event


def _node(i: int) -> tuple[str, events.EventData]:
    event = events.NodeChanged(
        change="deleted", name=f"n-{i}", allocatable=events.Resources(cpu=4), observed_at=NOW
    )
    return events.NODE_CHANGED.at(name=f"n-{i}").value, event


FLOODS: dict[str, Callable[[int], tuple[str, events.EventData]]] = {
    "workload.changed (serving, announced)": _workload,
    "workload.changed (the same, deleted)": _gone,
    "forecast (unannounced)": _forecast,
    "demand.observed (unannounced)": _observed,
    "scale.result (unknown target)": _result,
    "pod.changed (deleted, unknown)": _pod,
    "node.changed (deleted, unknown)": _node,
}


class Sampler:
    """Peak RSS per service, sampled in the background while the flood runs."""

    def __init__(self, pids: dict[str, int]) -> None:
        self.pids = pids
        self.before = {name: rss_mb(pid) for name, pid in pids.items()}
        self.peak = dict(self.before)
        self._stop = asyncio.Event()
        self._task = asyncio.create_task(self._run())

    async def _run(self) -> None:
        while not self._stop.is_set():
            for name, pid in self.pids.items():
                self.peak[name] = max(self.peak[name], rss_mb(pid))
            await asyncio.sleep(0.2)

    async def stop(self) -> dict[str, float]:
        """The last peaks; returns RSS now."""
        self._stop.set()
        await self._task
        return {name: rss_mb(pid) for name, pid in self.pids.items()}


@dataclass
class Row:
    service: str
    sent: dict[str, int]
    before: float
    peak: float
    after: float
    alive: bool
    notes: list[str] = field(default_factory=list)

    @property
    def verdict(self) -> str:
        if not self.alive:
            return "DIED"
        return "ok" if self.after - self.before <= GOAL_MB else "OVER"


def rows_of(sampler: Sampler, after: dict[str, float], sent: dict[str, int]) -> list[Row]:
    return [
        Row(name, sent, sampler.before[name], sampler.peak[name], after[name], True)
        for name in sampler.pids
    ]


def report(rows: list[Row]) -> None:
    header = ("service", "names/subject", "before MB", "peak MB", "after MB", "after-before")
    print("\n{:<12} {:>14} {:>10} {:>10} {:>10} {:>13}".format(*header), f" goal <= {GOAL_MB:g}")
    for row in rows:
        most = max(row.sent.values(), default=0)
        figures = (row.before, row.peak, row.after)
        print(
            f"{row.service:<12} {most:>14,}",
            *(f"{mb:>10.1f}" for mb in figures),
            f"{row.after - row.before:>+13.1f}",
            row.verdict,
        )
    for row in rows:
        for label, sent in row.sent.items():
            print(f"  {row.service}: {label}: {sent:,} sent")
        for note in row.notes:
            print(f"  {row.service}: {note}")


# `--tracemalloc`: imported by the planner and predictor at start (PYTHONPATH), it traces
# allocations and dumps a snapshot on each SIGUSR1 (renamed into place once written).
TRACE_HOOK = """
import os, signal, tracemalloc
_out = os.environ.get("SOAK_TRACEMALLOC")
if _out:
    tracemalloc.start(8)
    def _dump(signum, frame):
        path = f"{_out}/{os.getpid()}-{len(os.listdir(_out))}.snap"
        tracemalloc.take_snapshot().dump(path + ".part")
        os.rename(path + ".part", path)
    signal.signal(signal.SIGUSR1, _dump)
"""


def start(
    name: str, nats_url: str, logs: Path, extra: list[str], *, traced: Path | None = None
) -> tuple[subprocess.Popen[bytes], int]:
    port = free_port("127.0.0.1")
    env = dict(os.environ, MALLOC_ARENA_MAX="2")  # as the images set it (Dockerfile)
    if traced is not None:
        (traced / "hook").mkdir(exist_ok=True)
        (traced / "hook" / "sitecustomize.py").write_text(TRACE_HOOK)
        (traced / name).mkdir()
        env |= {"PYTHONPATH": str(traced / "hook"), "SOAK_TRACEMALLOC": str(traced / name)}
    with (logs / f"{name}.log").open("ab") as log:
        process = subprocess.Popen(
            [
                TIDESHIFT,
                "run",
                name,
                "--nats-url",
                nats_url,
                "--health-host",
                "127.0.0.1",
                "--health-port",
                str(port),
                "--log-level",
                "WARNING",
                *extra,
            ],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=log,
            env=env,
        )
    return process, port


async def snapshot(process: subprocess.Popen[bytes], directory: Path, index: int) -> Path:
    """The `index`th tracemalloc snapshot of a `--tracemalloc` service (600 s at most)."""
    wanted = directory / f"{process.pid}-{index}.snap"
    process.send_signal(signal.SIGUSR1)
    if not await wait_until(wanted.exists, timeout_s=600):
        raise SystemExit(f"no tracemalloc snapshot {wanted}")
    return wanted


def growth(before: Path, after: Path, top: int = 12) -> list[str]:
    """The allocation sites (8 frames) that grew most between two snapshots."""
    hide = [tracemalloc.Filter(False, tracemalloc.__file__)]
    old = tracemalloc.Snapshot.load(str(before)).filter_traces(hide)
    new = tracemalloc.Snapshot.load(str(after)).filter_traces(hide)
    total = sum(s.size_diff for s in new.compare_to(old, "filename"))
    lines = [f"tracemalloc: {total / 1e6:+.1f} MB traced in all; the largest growths:"]
    for stat in new.compare_to(old, "traceback")[:top]:
        lines.append(f"{stat.size_diff / 1e6:+.2f} MB in {stat.count_diff:+,} blocks, at")
        frames = list(stat.traceback)[::-1]  # the most recent first
        ours = [
            f for f in frames if f.filename.startswith(str(ROOT)) and "/.venv/" not in f.filename
        ]
        for frame in [*frames[:3], *(ours[:2] if ours[:1] != frames[:1] else [])]:
            source = linecache.getline(frame.filename, frame.lineno).strip()
            lines.append(f"      {frame.filename}:{frame.lineno}: {source}")
    return lines


Started = dict[str, tuple[subprocess.Popen[bytes], int]]


async def until_ready(processes: Started, logs: Path) -> dict[str, int]:
    """The services' pids once every one answers /readyz 200 (at most 300 s: slow to start
    on a loaded machine, and slower with --tracemalloc)."""
    deadline = time.monotonic() + 300
    while not all(ready(port) for _, port in processes.values()):
        if time.monotonic() > deadline or any(p.poll() is not None for p, _ in processes.values()):
            raise SystemExit(f"services not ready in 300 s; logs in {logs}")
        await asyncio.sleep(0.2)
    return {name: process.pid for name, (process, _) in processes.items()}


def stop_all(processes: Started, rows: list[Row]) -> None:
    for row in rows:
        if row.service in processes:
            row.alive = processes[row.service][0].poll() is None
    for process, _ in processes.values():
        process.terminate()
    for process, _ in processes.values():
        try:
            process.wait(60)
        except subprocess.TimeoutExpired:  # busy with a backlog: its figures are taken
            process.kill()
            process.wait(20)


# -- planner and predictor -------------------------------------------------------------------


async def flood(url: str, names: int, budget_s: float, only: str) -> dict[str, int]:
    bus = await Bus.connect(url, name="soak")
    sent: dict[str, int] = {}
    try:
        for label, make in FLOODS.items():
            if only not in label:
                continue
            # Deletions go to the names announced, however many the budget allowed.
            wanted = (
                sent.get("workload.changed (serving, announced)", names) if make is _gone else names
            )
            # Every announced workload is deleted, whatever the budget: "after" is what the
            # services keep once the flood's objects are gone.
            budget = float("inf") if make is _gone else budget_s
            sent[label] = await publish_each(bus, (make(i) for i in range(wanted)), budget)
            print(f"  {label}: {sent[label]:,} sent", flush=True)
    finally:
        await bus.close()
    return sent


async def publish_each(
    bus: Bus, messages: Iterator[tuple[str, events.EventData]], budget_s: float
) -> int:
    """Core-NATS publishes until `messages` ends or the budget is spent; how many were sent."""
    deadline = time.monotonic() + budget_s
    sent = 0
    for subject, event in messages:
        if time.monotonic() >= deadline:
            break
        await bus.connection.publish(subject, events.encode(event, source="soak"))
        sent += 1
        if sent % 1000 == 0:
            await bus.flush(timeout=60)
    await bus.flush(timeout=60)
    return sent


async def soak_bus_services(args: argparse.Namespace, nats_url: str, logs: Path) -> list[Row]:
    traced = logs / "tracemalloc" if args.tracemalloc else None
    if traced is not None:
        traced.mkdir()
    processes = {
        "planner": start("planner", nats_url, logs, ["--instance", "soak"], traced=traced),
        "predictor": start(
            "predictor",
            nats_url,
            logs,
            ["--metric-source", "sim", "--model", "tidal"],
            traced=traced,
        ),
    }
    rows: list[Row] = []
    try:
        pids = await until_ready(processes, logs)
        if args.warmup:
            await warm_up(args, nats_url, processes)
        firsts = await snapshots(processes, traced, 0)
        sampler = Sampler(pids)
        sent = await flood(nats_url, args.names, args.budget, args.only)
        port = processes["predictor"][1]
        took = await caught_up({name: p[1] for name, p in processes.items()}, args.settle)
        # the predictor hands removed models' memory back about 1 s after removing them
        await settled_rss(processes["predictor"][0].pid, timeout_s=15)
        # The planner hands a flood's freed memory back after its next snapshot resync.
        await asyncio.sleep(args.linger)
        await settled_rss(processes["planner"][0].pid, timeout_s=15)
        rows = rows_of(sampler, await sampler.stop(), sent)
        at_cap = metric(port, "tideshift_predictor_announcements_skipped_total")
        left = metric(port, "tideshift_predictor_workloads")
        planned = metric(processes["planner"][1], "tideshift_planner_targets")
        rows[-1].notes.append(
            f"{at_cap} announcements skipped at the cap; {left} workloads forecast and "
            f"{planned} planned {took:.0f} s after the flood (at most --settle {args.settle:g})"
        )
        lasts = await snapshots(processes, traced, 1)
        for row in rows if firsts else ():
            row.notes += await asyncio.to_thread(growth, firsts[row.service], lasts[row.service])
    finally:
        stop_all(processes, rows)
    return rows


async def warm_up(args: argparse.Namespace, nats_url: str, processes: Started) -> None:
    """A small flood first, applied and cleared (--warmup names per subject), so that "before"
    is a service that has planned and forecast: its first plans' one-time costs (modules
    imported on first use, caches) are not counted as what the big flood left."""
    print(f"  warm-up: {args.warmup:,} names per subject", flush=True)
    await flood(nats_url, args.warmup, args.budget, args.only)
    await caught_up({name: p[1] for name, p in processes.items()}, args.settle)
    await asyncio.sleep(args.linger)  # the planner's resync (a period, not a condition)
    for process, _ in processes.values():
        await settled_rss(process.pid, timeout_s=15)


async def snapshots(processes: Started, traced: Path | None, index: int) -> dict[str, Path]:
    """A tracemalloc snapshot of each service, with `--tracemalloc` (else none)."""
    if traced is None:
        return {}
    return {
        name: await snapshot(process, traced / name, index)
        for name, (process, _) in processes.items()
    }


# -- executor --------------------------------------------------------------------------------


def unmanaged_objects(local: LocalCluster, count: int) -> None:
    """`count` StatefulSets of 0 replicas (no pods to schedule), none labelled with a role."""
    with local.api_client() as client:
        http = KubeHttp(client)
        create(http, "/api/v1/namespaces", {"metadata": {"name": "soak"}})
        path = "/apis/apps/v1/namespaces/soak/statefulsets"
        with ThreadPoolExecutor(8) as pool:
            list(pool.map(lambda i: create(http, path, statefulset(f"s-{i}", 0)), range(count)))


def command(kind: str, name: str, index: int) -> tuple[str, events.EventData]:
    target = events.WorkloadRef(kind=kind, namespace="soak", name=name)
    event = events.ScaleCommand(
        target=target,
        desired=1,
        reason="soak",
        plan_id="soak",
        issued_at=NOW,
        idempotency_key=f"soak-{kind}-{index}",
    )
    subject = events.SCALE_COMMAND.at(namespace="soak", kind=kind, name=name).value
    return subject, event


class Results:
    """Scale results seen on the bus, by outcome."""

    def __init__(self) -> None:
        self.outcomes: dict[str, int] = {}

    @property
    def total(self) -> int:
        return sum(self.outcomes.values())

    async def on_message(self, message: Any) -> None:
        outcome = json.loads(message.data)["data"]["outcome"]
        self.outcomes[outcome] = self.outcomes.get(outcome, 0) + 1


async def paced_commands(
    bus: Bus, results: Results, commands: Iterator[tuple[str, events.EventData]], budget_s: float
) -> int:
    """Publishes commands at most WINDOW ahead of their results, within the budget."""
    deadline, sent, base = time.monotonic() + budget_s, 0, results.total
    for subject, event in commands:
        while sent - (results.total - base) >= WINDOW:
            if time.monotonic() >= deadline:
                return sent
            await asyncio.sleep(0.05)
        if time.monotonic() >= deadline:
            break
        await bus.connection.publish(subject, events.encode(event, source="soak"))
        sent += 1
    await bus.flush(timeout=60)
    return sent


async def flood_executor(
    args: argparse.Namespace, url: str, objects: int
) -> tuple[dict[str, int], Results]:
    bus = await Bus.connect(url, name="soak")
    results = Results()
    await bus.connection.subscribe(events.SCALE_RESULT.filter().value, cb=results.on_message)
    sent: dict[str, int] = {}
    try:
        floods = {
            "scale.command (targets that do not exist)": (
                command("Deployment.apps", f"u-{i}", i) for i in range(args.names)
            ),
            "scale.command (unlabelled StatefulSets, one Event each)": (
                command("StatefulSet.apps", f"s-{i}", i) for i in range(objects)
            ),
        }
        for label, commands in floods.items():
            sent[label] = await paced_commands(bus, results, commands, args.budget)
            print(f"  {label}: {sent[label]:,} sent", flush=True)
        total = sum(sent.values())
        await wait_until(lambda: results.total >= total, timeout_s=args.settle)
    finally:
        await bus.close()
    return sent, results


async def soak_executor(args: argparse.Namespace, nats_url: str, logs: Path) -> list[Row]:
    bin_dir = default_bin_dir()
    if stale_binaries(bin_dir):
        print(f"executor: skipped, no Kubernetes binaries in {bin_dir}")
        return []
    options = ClusterOptions(bin_dir=bin_dir, nodes=default_nodes(1), storage=False)
    with LocalCluster(options) as local:
        objects = min(args.objects, args.names)
        print(f"executor: creating {objects:,} unlabelled StatefulSets", flush=True)
        await asyncio.to_thread(unmanaged_objects, local, objects)
        kubeconfig = ["--kubeconfig", str(local.kubeconfig_path)]
        processes = {"executor": start("executor", nats_url, logs, kubeconfig)}
        rows: list[Row] = []
        try:
            sampler = Sampler(await until_ready(processes, logs))
            sent, results = await flood_executor(args, nats_url, objects)
            await settled_rss(processes["executor"][0].pid, timeout_s=15)
            rows = rows_of(sampler, await sampler.stop(), sent)
            rows[0].notes.append(f"results by outcome: {results.outcomes}")
        finally:
            stop_all(processes, rows)
    return rows


# -- training coordinator --------------------------------------------------------------------


def membership(trainer: str, change: str) -> tuple[str, events.EventData]:
    event = events.TrainerMembership(job=JOB, trainer=trainer, change=change, at=NOW)
    return events.TRAINER_MEMBERSHIP.at(job=JOB, trainer=trainer).value, event


async def join_and_leave(bus: Bus, names: int, budget_s: float) -> int:
    """Trainers `j-<i>` join (member key) and leave (announced, key deleted), 100 at a time."""
    members = await bus.kv(events.TRAINER_MEMBERS_BUCKET, ttl_seconds=MEMBER_TTL_SECONDS)
    deadline, done = time.monotonic() + budget_s, 0
    while done < names and time.monotonic() < deadline:
        batch = [f"j-{i}" for i in range(done, min(done + 100, names))]
        await asyncio.gather(
            *(
                members.put(member_key(JOB, t), MemberBeat(job=JOB, trainer=t, at=NOW))
                for t in batch
            )
        )
        for trainer in batch:
            subject, event = membership(trainer, "left")
            await bus.connection.publish(subject, events.encode(event, source="soak"))
        await asyncio.gather(*(members.delete(member_key(JOB, t)) for t in batch))
        done += len(batch)
    return done


async def soak_coordinator(args: argparse.Namespace, nats_url: str, logs: Path) -> list[Row]:
    dataset = ["--job", JOB, "--dataset", '["soak://shard-0"]']
    processes = {"coordinator": start("coordinator", nats_url, logs, dataset)}
    rows: list[Row] = []
    try:
        sampler = Sampler(await until_ready(processes, logs))
        bus = await Bus.connect(nats_url, name="soak")
        try:
            never = (membership(f"t-{i}", "left") for i in range(args.names))
            sent = {
                "training.member left (never joined)": await publish_each(bus, never, args.budget)
            }
            print(f"  left (never joined): {sent['training.member left (never joined)']:,} sent")
            label = "member key put, left, key deleted"
            sent[label] = await join_and_leave(bus, args.names, args.budget)
            print(f"  {label}: {sent[label]:,} sent", flush=True)
        finally:
            await bus.close()
        await settled_rss(processes["coordinator"][0].pid, timeout_s=30)
        rows = rows_of(sampler, await sampler.stop(), sent)
    finally:
        stop_all(processes, rows)
    return rows


# -- watcher ---------------------------------------------------------------------------------


class ChurnCluster:
    """The watcher's port: nothing listed, then distinct objects added and deleted. It waits
    for a line on stdin before the flood and after it (the parent measures RSS then)."""

    def __init__(self, names: int, budget_s: float) -> None:
        self.names, self.budget_s = names, budget_s
        self.version = counting(1)
        self.watcher: Watcher | None = None
        self.adapter = default_adapters()[KIND]
        self.traced: Path | None = None  # --tracemalloc: the snapshot taken when ready

    async def list_nodes(self) -> list[Node]:
        return []

    async def list_pods(self) -> list[Pod]:
        return []

    async def list_workloads(self) -> list[Workload]:
        return []

    def unwatched(self) -> list[str]:
        return []

    async def record_event(self, target: Any, *, reason: str, message: str) -> None:
        raise AssertionError(f"the generated workloads are valid: {message}")

    def _pod(self, i: int) -> Pod:
        obj = pod_object(f"p-{i}", None, "other", "node-00000", next(self.version))
        return pod_from_object(obj, resolve_owner)

    def _workload(self, i: int) -> Workload:
        obj = workload_object(f"w-{i}", 1, "serving", next(self.version))
        return workload_from_object(self.adapter, obj)

    def _node(self, i: int) -> Node:
        return node_from_object(node_object(i, next(self.version)))

    async def watch(self) -> AsyncIterator[ClusterChange]:
        await asyncio.to_thread(sys.stdin.readline)
        makers: dict[str, Callable[[int], Node | Pod | Workload]] = {
            "pods": self._pod,
            "labelled Deployments": self._workload,
            "nodes": self._node,
        }
        for label, make in makers.items():
            deadline, sent = time.monotonic() + self.budget_s, 0
            while sent < self.names and time.monotonic() < deadline:
                yield ClusterChange("added", make(sent))
                yield ClusterChange("deleted", make(sent))
                sent += 1
            print("SENT " + json.dumps({label: sent}), flush=True)
        assert self.watcher is not None
        await self.watcher.flushed()
        if self.traced is not None:
            after = self.traced.with_suffix(".after")
            tracemalloc.take_snapshot().dump(str(after))
            for line in growth(self.traced, after):
                print(line, flush=True)
        print("DONE " + json.dumps(await watcher_state(self.watcher)), flush=True)
        await asyncio.to_thread(sys.stdin.readline)


async def watcher_state(watcher: Watcher) -> dict[str, int]:
    assert watcher.snapshot is not None
    return {
        "live versions": len(watcher.order.live),
        "tombstones": len(watcher.order.tombstones),
        "pending snapshot writes": len(watcher._pending),
        "invalid policies remembered": len(watcher._reported),
        "snapshot keys": len(await watcher.snapshot.keys()),
    }


async def watcher_child(args: argparse.Namespace) -> None:
    port = ChurnCluster(args.names, args.budget)
    if args.tracemalloc:
        tracemalloc.start(8)
    bus = await Bus.connect(args.nats_url, name="soak-watcher")
    port.watcher = Watcher(port, bus)
    listed = asyncio.Event()
    running = asyncio.create_task(port.watcher.run(listed))
    await listed.wait()
    if args.tracemalloc:
        port.traced = Path(tempfile.mkdtemp(prefix="soak-watcher-")) / "ready.snap"
        tracemalloc.take_snapshot().dump(str(port.traced))
    print("READY " + json.dumps(await watcher_state(port.watcher)), flush=True)
    await running
    await bus.close()


async def child_line(child: subprocess.Popen[str], prefix: str, timeout_s: float) -> str:
    """The child's next stdout line starting with `prefix` (earlier ones are printed)."""
    assert child.stdout is not None
    while True:
        line = await asyncio.wait_for(asyncio.to_thread(child.stdout.readline), timeout_s)
        if not line:
            raise SystemExit(f"the watcher process ended before {prefix}")
        if line.startswith(prefix):
            return line[len(prefix) :].strip()
        print("  watcher:", line.rstrip(), flush=True)


def spawn_watcher(args: argparse.Namespace, nats_url: str) -> subprocess.Popen[str]:
    sizes = ["--names", str(args.names), "--budget", str(args.budget)]
    sizes += ["--tracemalloc"] if args.tracemalloc else []
    return subprocess.Popen(
        [sys.executable, __file__, "--watcher-child", nats_url, *sizes],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=dict(os.environ, MALLOC_ARENA_MAX="2"),  # as the images set it (Dockerfile)
    )


async def soak_watcher(args: argparse.Namespace, nats_url: str) -> list[Row]:
    child = spawn_watcher(args, nats_url)
    assert child.stdin is not None
    rows: list[Row] = []
    try:
        start_state = await child_line(child, "READY ", 120)
        sampler = Sampler({"watcher": child.pid})
        child.stdin.write("flood\n")
        child.stdin.flush()
        sent: dict[str, int] = {}
        for _ in range(3):
            sent |= json.loads(await child_line(child, "SENT ", args.budget + args.settle))
        end_state = await child_line(child, "DONE ", args.settle)
        await settled_rss(child.pid, timeout_s=15)
        rows = rows_of(sampler, await sampler.stop(), sent)
        rows[0].notes += [f"state before: {start_state}", f"state after: {end_state}"]
        rows[0].alive = child.poll() is None
    finally:
        child.stdin.close()
        child.wait(60)
    return rows


SOAKS: dict[str, Callable[[argparse.Namespace, str, Path], Awaitable[list[Row]]]] = {
    "planner": soak_bus_services,
    "executor": soak_executor,
    "coordinator": soak_coordinator,
    "watcher": lambda args, url, _logs: soak_watcher(args, url),
}


async def main_async(args: argparse.Namespace) -> None:
    if args.watcher_child:
        await watcher_child(args)
        return
    logs = Path(tempfile.mkdtemp(prefix="soak-"))
    rows: list[Row] = []
    for service in args.services.split(","):
        print(
            f"{service}: flooding {args.names:,} names per subject (at most {args.budget:g} s each)"
        )
        with EmbeddedNats() as nats:  # a fresh server each: no backlog from another's flood
            rows += await SOAKS[service](args, nats.url, logs)
    report(rows)
    print(f"logs: {logs}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--names", type=int, default=1_000_000, help="distinct names per subject")
    parser.add_argument("--budget", type=float, default=120.0, help="seconds per subject at most")
    parser.add_argument(
        "--linger",
        type=float,
        default=130.0,
        help="seconds to wait after catching up before the planner's 'after' (its snapshot "
        "resync, every 2 min, hands freed memory back)",
    )
    parser.add_argument(
        "--settle",
        type=float,
        default=600.0,
        help="at most this long for a service to catch up with its flood (the predictor "
        "resyncs with the snapshot every 2 min)",
    )
    parser.add_argument("--only", default="", help="planner: flood only the subjects with this")
    parser.add_argument(
        "--objects", type=int, default=5000, help="executor: unlabelled StatefulSets to create"
    )
    parser.add_argument(
        "--tracemalloc",
        action="store_true",
        help="planner, predictor and watcher: trace their allocations and print what grew "
        "(slower; their RSS then includes tracemalloc's own)",
    )
    parser.add_argument("--services", default=",".join(SOAKS), help="comma-separated, in order")
    parser.add_argument(
        "--warmup",
        type=int,
        default=0,
        help="planner and predictor: names per subject of a small flood applied and cleared "
        "before 'before' is read (0: none)",
    )
    parser.add_argument("--watcher-child", metavar="NATS_URL", help=argparse.SUPPRESS)
    args = parser.parse_args()
    args.nats_url = args.watcher_child
    unknown = set(args.services.split(",")) - set(SOAKS)
    if unknown:
        parser.error(
            f"--services: unknown {', '.join(sorted(unknown))}; expected {', '.join(SOAKS)}"
        )
    asyncio.run(main_async(args))


if __name__ == "__main__":
    main()
