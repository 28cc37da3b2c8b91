"""Benchmark: Kubernetes -> watcher -> NATS, and NATS -> executor -> Kubernetes.

Starts its own control plane (etcd, kube-apiserver, controller-manager, scheduler, kwok with
200 fake nodes) and nats-server, runs `tideshift run watcher` and `tideshift run executor` as
real processes, and prints:

(a) pod change in the apiserver -> PodChanged on NATS: p50/p99 (pod creations, one at a time)
(c) watcher throughput while 2,000 pods are created, scheduled and started; then a watcher
    with an empty snapshot: cold list to its first complete snapshot
(b) with those pods in place: ScaleCommand on NATS -> new replicas visible in the apiserver
    (a watch): p50/p90/p99, against a direct GET + PUT of the scale subresource and one NATS
    round trip (core PING/PONG and a JetStream publish ack) in the same run, and where the
    executor's time went (its `tideshift_executor_phase_seconds`, scraped from /metrics)
(d) create/delete churn at rising rates until the watcher's lag grows: events/s sustained
then every pod is deleted.

Usage: .venv/bin/python tests/benchmarks/bench_watch_scale.py [--nodes 200] [--pods 2000]
       [--churn-rates 50,100,200,400] [--churn-seconds 15]
It asserts nothing about time; it prints figures.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
import uuid
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import urllib3.exceptions  # noqa: E402
from kubernetes.client.exceptions import ApiException  # noqa: E402
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

from tests.k8s.cluster_objects import create, deployment, pod_template, wait_until  # noqa: E402
from tideshift.events import POD_CHANGED, SCALE_COMMAND, ScaleCommand, WorkloadRef  # noqa: E402
from tideshift.services.cluster.adapters.http import KubeHttp  # noqa: E402
from tideshift.services.common.bus import Bus  # noqa: E402
from tideshift.services.common.embedded_nats import EmbeddedNats  # noqa: E402
from tideshift.services.devcluster.cluster import ClusterOptions, LocalCluster  # noqa: E402
from tideshift.services.devcluster.nodes import default_nodes  # noqa: E402
from tideshift.services.devcluster.versions import default_bin_dir  # noqa: E402

NAMESPACE = "bench"


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))
    return ordered[index]


def summary(label: str, seconds: list[float]) -> str:
    ms = [s * 1000 for s in seconds]
    return (
        f"{label}: n={len(ms)} p50={percentile(ms, 50):.1f} ms p90={percentile(ms, 90):.1f} ms "
        f"p99={percentile(ms, 99):.1f} ms max={max(ms):.1f} ms mean={statistics.fmean(ms):.1f} ms"
    )


def bare_pod(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": {"bench": "1", "tideshift.io/role": "other"}},
        "spec": pod_template({})["spec"],
    }


class PodEvents:
    """PodChanged events received in this process, with their arrival times."""

    def __init__(self) -> None:
        self.first_seen: dict[tuple[str, str], float] = {}  # (change, name) -> time
        self.running: dict[str, float] = {}
        self.count = 0
        self.waiters: dict[tuple[str, str], asyncio.Event] = {}

    def record(self, change: str, name: str, phase: str) -> None:
        now = time.perf_counter()
        self.count += 1
        self.first_seen.setdefault((change, name), now)
        if phase == "Running":
            self.running.setdefault(name, now)
        waiter = self.waiters.get((change, name))
        if waiter is not None:
            waiter.set()

    async def wait(self, change: str, name: str, timeout: float = 30.0) -> float:
        if (change, name) not in self.first_seen:
            event = self.waiters.setdefault((change, name), asyncio.Event())
            await asyncio.wait_for(event.wait(), timeout)
        return self.first_seen[(change, name)]


async def follow_pods(bus: Bus, events: PodEvents) -> None:
    async for envelope in bus.subscribe(
        POD_CHANGED.filter(namespace=NAMESPACE), consumer="bench", buffer=200_000
    ):
        data = envelope.data
        events.record(data.change, data.name, data.phase)


def watch_replicas(
    http: KubeHttp, seen: dict[int, list[float]], stop: threading.Event, listed: threading.Event
) -> None:
    """Records when each Deployment spec.replicas value appears in the apiserver (a watch,
    resumed where it broke off: a loaded apiserver ends watches early)."""
    path = f"/apis/apps/v1/namespaces/{NAMESPACE}/deployments"
    version = ""
    while not stop.is_set():
        if not version:
            version = http.get(path)["metadata"]["resourceVersion"]
            listed.set()
        query = [("watch", "true"), ("resourceVersion", version), ("timeoutSeconds", "60")]
        try:
            response = http.request("GET", path, query=query, timeout=(5, 90))
            for line in http.lines(response):
                now = time.perf_counter()
                event = json.loads(line)
                obj = event["object"]
                if event["type"] == "ERROR":  # 410 Gone: list again
                    version = ""
                    break
                version = obj["metadata"]["resourceVersion"]
                if obj["metadata"].get("name") == "bench-web":
                    seen.setdefault(int(obj["spec"]["replicas"]), []).append(now)
                if stop.is_set():
                    return
        except (urllib3.exceptions.HTTPError, OSError) as error:
            print(f"    (replicas watch broke off: {error}; resumed)", flush=True)
            stop.wait(1.0)


def start_service(
    name: str,
    nats_url: str,
    kubeconfig: Path,
    log_dir: Path,
    *extra: str,
    health_port: int = -1,
    tree: Path = ROOT,
) -> Any:
    """`tideshift run <name>` from `tree`: this checkout, or an older one (`git archive`),
    whose own code then comes first on the import path."""
    log = (log_dir / f"{name}-{tree.name}.log").open("ab")
    env = {**os.environ, "PYTHONPATH": str(tree)} if tree != ROOT else None
    return subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys; from services.cli import main; sys.exit(main())",
            "run",
            name,
            "--nats-url",
            nats_url,
            "--kubeconfig",
            str(kubeconfig),
            "--health-port",
            str(health_port),
            "--log-level",
            "WARNING",
            *extra,
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        cwd=tree,
        env=env,
    )


async def bench_pod_latency(http: KubeHttp, events: PodEvents, samples: int) -> None:
    from_request: list[float] = []
    from_response: list[float] = []
    for i in range(samples):
        name = f"lat-{i}"
        started = time.perf_counter()
        await asyncio.to_thread(
            http.json, "POST", f"/api/v1/namespaces/{NAMESPACE}/pods", body=bare_pod(name)
        )
        answered = time.perf_counter()
        seen = await events.wait("added", name)
        from_request.append(seen - started)
        from_response.append(max(0.0, seen - answered))
    print(summary("(a) pod create request -> PodChanged(added) on NATS", from_request))
    print(summary("    apiserver answer   -> PodChanged(added) on NATS", from_response))


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def scrape(port: int) -> Samples:
    """Every sample a service's /metrics shows, by name and labels."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        text = response.read().decode()
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def histogram_rows(before: Samples, after: Samples, name: str, label: str | None) -> list[str]:
    """Per label value of a histogram, what it gathered between two scrapes: count, mean and
    the bucket bound at its 90th and 99th percentiles."""
    rows: list[str] = []
    for (sample, labels), cumulative in sorted(after.items()):
        if sample != f"{name}_count":
            continue
        count = cumulative - before.get((sample, labels), 0.0)
        if count <= 0:
            continue
        total = after[(f"{name}_sum", labels)] - before.get((f"{name}_sum", labels), 0.0)
        buckets = sorted(
            (float(dict(bucket_labels)["le"]), value - before.get((bucket, bucket_labels), 0.0))
            for (bucket, bucket_labels), value in after.items()
            if bucket == f"{name}_bucket"
            and {k: v for k, v in bucket_labels if k != "le"} == dict(labels)
        )

        def bound(q: float, buckets: list[tuple[float, float]] = buckets, n: float = count) -> str:
            upper = next(le for le, cumulative in buckets if cumulative >= q * n)
            return f"<={upper * 1000:g} ms" if upper != float("inf") else "above the last bucket"

        what = dict(labels).get(label, "") if label else "whole command"
        rows.append(
            f"      {what:<18} n={count:<5.0f} total {total:7.2f}s "
            f"mean {total / count * 1000:7.1f} ms"
            f"  p90 {bound(0.9)}  p99 {bound(0.99)}"
        )
    return rows


async def nats_round_trips(bus: Bus, samples: int) -> list[float]:
    """Core NATS PING/PONG round trips from this process."""
    trips: list[float] = []
    for _ in range(samples):
        started = time.perf_counter()
        await bus.flush()
        trips.append(time.perf_counter() - started)
    return trips


async def scale_commands(
    bus: Bus, seen: dict[int, list[float]], samples: int
) -> tuple[list[float], list[float]]:
    """ScaleCommands one at a time, each once its replicas showed: the latencies to visible
    replicas and the JetStream publish acks."""
    latencies: list[float] = []
    publish_acks: list[float] = []
    target = WorkloadRef(kind="Deployment.apps", namespace=NAMESPACE, name="bench-web")
    subject = SCALE_COMMAND.at(namespace=NAMESPACE, kind=target.kind, name="bench-web")
    run = uuid.uuid4().hex[:8]  # JetStream drops a msg_id it saw within 2 minutes
    for i in range(samples):
        desired = 2 + (i % 2)  # alternate 2 and 3: always a real change, half of them down
        before = len(seen.get(desired, []))
        command = ScaleCommand(
            target=target,
            desired=desired,
            reason="benchmark",
            plan_id=f"bench-{i}",
            issued_at=datetime.now(UTC),
            idempotency_key=f"bench-{run}-{i}",
        )
        started = time.perf_counter()
        await bus.publish_durable(subject, command, msg_id=command.idempotency_key)
        publish_acks.append(time.perf_counter() - started)
        deadline = started + 60
        while len(seen.get(desired, [])) <= before:
            if time.perf_counter() > deadline:
                raise TimeoutError(
                    f"command {i} (replicas {desired}) not visible within 60 s; "
                    f"{len(latencies)} before it: {summary('visible', latencies or [0.0])}"
                )
            await asyncio.sleep(0.0005)
        latencies.append(seen[desired][before] - started)
    return latencies, publish_acks


async def bench_scale_latency(
    bus: Bus, http: KubeHttp, samples: int, metrics_port: int
) -> dict[str, float]:
    """(b) for the executor serving `metrics_port`; its figures for the before/after table."""
    seen: dict[int, list[float]] = {}
    stop, listed = threading.Event(), threading.Event()
    watcher = threading.Thread(target=watch_replicas, args=(http, seen, stop, listed), daemon=True)
    watcher.start()
    try:
        if not await asyncio.to_thread(listed.wait, 60):
            raise TimeoutError("the replicas watch never listed")
        metrics_before = await asyncio.to_thread(scrape, metrics_port)
        latencies, publish_acks = await scale_commands(bus, seen, samples)
    finally:
        stop.set()
    metrics_after = await asyncio.to_thread(scrape, metrics_port)
    print(summary("(b) ScaleCommand published -> replicas visible in the apiserver", latencies))
    print("    executor, from /metrics: receive -> result published, then each step")
    for name, label in (
        ("tideshift_executor_seconds", None),
        ("tideshift_executor_phase_seconds", "phase"),
    ):
        for row in histogram_rows(metrics_before, metrics_after, name, label):
            print(row)
    print(summary("    NATS: JetStream publish -> ack (the command's own)", publish_acks))
    print(summary("    NATS: core PING -> PONG", await nats_round_trips(bus, samples)))
    direct = await direct_scale_writes(http, min(samples, 100))
    print(summary("    baseline: GET + PUT of the scale subresource, directly", direct))
    figures = {
        "p50": percentile(latencies, 50),
        "p90": percentile(latencies, 90),
        "p99": percentile(latencies, 99),
        "direct p99": percentile(direct, 99),
        "JetStream ack p99": percentile(publish_acks, 99),
    }
    figures["goal"] = 2 * figures["direct p99"] + figures["JetStream ack p99"]
    print(
        f"    goal: p99 <= 2 x direct p99 + one JetStream round trip p99 = "
        f"{figures['goal'] * 1000:.1f} ms; measured p99 {figures['p99'] * 1000:.1f} ms"
    )
    return figures


def wait_ready(port: int, process: Any, timeout: float = 120.0) -> None:
    """Until the service on `port` answers /readyz with 200."""
    deadline = time.perf_counter() + timeout
    while True:
        if process.poll() is not None:
            raise RuntimeError(f"the service exited ({process.returncode}) before it was ready")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=2):
                return
        except OSError:
            if time.perf_counter() > deadline:
                raise
        time.sleep(0.1)


async def compare_executors(
    bus: Bus, http: KubeHttp, start: Any, trees: list[tuple[str, Path, int]]
) -> None:
    """(b) once per executor (label, checkout, samples): older checkouts' first, if given, one
    at a time on the same durable consumer; then the before/after table."""
    web = deployment("bench-web", 1)
    web["metadata"]["labels"] = {"tideshift.io/role": "serving"}  # the executor acts on it
    await asyncio.to_thread(create, http, f"/apis/apps/v1/namespaces/{NAMESPACE}/deployments", web)
    table: dict[str, dict[str, float]] = {}
    for label, tree, samples in trees:
        port = free_port()
        process = start("executor", port, tree)
        try:
            await asyncio.to_thread(wait_ready, port, process)
            print(f"--- executor {label}: {tree}", flush=True)
            try:
                table[label] = await bench_scale_latency(bus, http, samples, port)
            except TimeoutError as error:  # that executor's figure is "did not keep up"
                print(f"    executor {label} gave up: {error}", flush=True)
                continue
            table[label]["RSS MiB"] = rss_mib(process)
            table[label]["n"] = samples
        finally:
            process.terminate()
            await asyncio.to_thread(process.wait, 30)
    if not table:
        return
    columns = [*next(iter(table.values()))]
    print("(b) command -> replicas visible, ms (RSS in MiB):")
    print(f"    {'executor':<10}" + "".join(f"{column:>20}" for column in columns))
    for label, figures in table.items():
        cells = [figures[c] if c in ("RSS MiB", "n") else figures[c] * 1000 for c in columns]
        print(f"    {label:<10}" + "".join(f"{cell:>20.1f}" for cell in cells))


async def direct_scale_writes(http: KubeHttp, samples: int) -> list[float]:
    """The same machine's apiserver asked directly: what the executor's path costs beyond its
    two apiserver round trips is NATS, KV records and its own work."""
    direct: list[float] = []
    scale_path = f"/apis/apps/v1/namespaces/{NAMESPACE}/deployments/bench-web/scale"
    conflicts = 0
    for i in range(samples):
        started = time.perf_counter()
        while True:  # the Deployment controller writes status too: re-read on 409
            current = await asyncio.to_thread(http.get, scale_path)
            current["spec"]["replicas"] = 2 + (i % 2)
            try:
                await asyncio.to_thread(http.json, "PUT", scale_path, body=current)
                break
            except ApiException as error:
                if error.status != 409:
                    raise
                conflicts += 1
        direct.append(time.perf_counter() - started)
    if conflicts:
        print(f"    (baseline re-read after {conflicts} conflicts with the Deployment controller)")
    return direct


async def bench_cold_start(restart_watcher: Any, events: PodEvents, names: list[str]) -> None:
    """A watcher started with an empty snapshot lists and publishes every pod at once."""
    for name in names:
        events.first_seen.pop(("added", name), None)
    started = time.perf_counter()
    await asyncio.to_thread(restart_watcher)
    for name in names:
        await events.wait("added", name, timeout=600)
    arrivals = [events.first_seen[("added", name)] for name in names]
    first, last = min(arrivals), max(arrivals)
    print(
        f"    cold start with {len(names)} pods (new snapshot bucket): process start to first "
        f"complete snapshot (last pod published) {last - started:.1f}s; first to last event "
        f"{last - first:.2f}s = {len(names) / max(last - first, 1e-6):.0f} pods/s listed, "
        "converted and published"
    )


async def in_threads(calls: list[Any], threads: int = 8) -> list[Any]:
    """Each call run in a pool of `threads` threads; their results in order."""
    loop = asyncio.get_running_loop()
    with ThreadPoolExecutor(threads) as pool:
        return await asyncio.gather(*(loop.run_in_executor(pool, call) for call in calls))


async def create_pods(http: KubeHttp, events: PodEvents, names: list[str]) -> None:
    path = f"/api/v1/namespaces/{NAMESPACE}/pods"
    pods = len(names)
    count_before = events.count
    started = time.perf_counter()
    await in_threads(
        [functools.partial(http.json, "POST", path, body=bare_pod(name)) for name in names]
    )
    created = time.perf_counter()
    for name in names:
        await events.wait("added", name, timeout=600)
    all_added = time.perf_counter()
    deadline = time.perf_counter() + 1200
    while any(name not in events.running for name in names):
        if time.perf_counter() > deadline:
            missing = sum(1 for name in names if name not in events.running)
            raise TimeoutError(f"{missing} pods never reported Running")
        await asyncio.sleep(0.05)
    all_running = max(events.running[name] for name in names)
    create_events = events.count - count_before
    print(
        f"(c) {pods} pods: client created them in {created - started:.1f}s "
        f"({pods / (created - started):.0f}/s); all 'added' events by {all_added - started:.1f}s; "
        f"all Running events by {all_running - started:.1f}s (scheduler + kwok pace)"
    )
    print(
        f"    watcher published {create_events} pod events in {all_running - started:.1f}s "
        f"= {create_events / (all_running - started):.0f} events/s sustained"
    )


async def delete_pods(http: KubeHttp, events: PodEvents, names: list[str]) -> None:
    # One DELETE per pod from 8 threads, like the creation: a delete-collection of 2,000 pods
    # outlives the apiserver's 60 s request timeout on a busy 2-core machine.
    path = f"/api/v1/namespaces/{NAMESPACE}/pods"
    count_before = events.count
    started = time.perf_counter()
    await in_threads(
        [
            functools.partial(http.json, "DELETE", f"{path}/{name}", body={"gracePeriodSeconds": 0})
            for name in names
        ]
    )
    deleted_call = time.perf_counter()
    for name in names:
        await events.wait("deleted", name, timeout=1200)
    all_deleted = time.perf_counter()
    delete_events = events.count - count_before
    print(
        f"    {len(names)} deletes answered in {deleted_call - started:.1f}s; all 'deleted' "
        f"events by {all_deleted - started:.1f}s; {delete_events} events "
        f"= {delete_events / (all_deleted - started):.0f} events/s"
    )


def churn_call(http: KubeHttp, change: str, name: str, live: deque[str]) -> tuple[str, str, float]:
    """One create or delete; what the watcher should report and when the apiserver answered.
    A created pod joins `live` once created (only those are deleted)."""
    path = f"/api/v1/namespaces/{NAMESPACE}/pods"
    if change == "added":
        http.json("POST", path, body=bare_pod(name))
        live.append(name)
    else:
        http.json("DELETE", f"{path}/{name}", body={"gracePeriodSeconds": 0})
    return change, name, time.perf_counter()


async def churn_step(
    http: KubeHttp, events: PodEvents, live: deque[str], rate: float, seconds: float
) -> tuple[float, float, list[float]]:
    """Creates and deletes (half each) paced at `rate` per second for `seconds`: the request
    rate reached, the PodChanged events per second received meanwhile, and each request's
    lag from the apiserver's answer to its event on NATS."""
    loop = asyncio.get_running_loop()
    count_before = events.count
    calls = []
    started = time.perf_counter()
    with ThreadPoolExecutor(32) as pool:
        for i in range(int(rate * seconds)):
            delay = started + i / rate - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            if i % 2 == 0 or not live:
                change, name = "added", f"churn-{uuid.uuid4().hex[:10]}"
            else:
                change, name = "deleted", live.popleft()
            calls.append(loop.run_in_executor(pool, churn_call, http, change, name, live))
        answers = await asyncio.gather(*calls)
    answered = time.perf_counter()
    lags = [
        max(0.0, await events.wait(change, name, timeout=300) - at) for change, name, at in answers
    ]
    seen = time.perf_counter()
    return (
        len(answers) / (answered - started),
        (events.count - count_before) / (seen - started),
        lags,
    )


async def bench_churn(
    http: KubeHttp, events: PodEvents, rates: list[float], seconds: float
) -> list[str]:
    """(d) churn at each rate in turn, until the lag's p99 passes 1 s or the requests fall
    behind the pace; returns the pods still there."""
    live: deque[str] = deque()
    print(f"(d) create/delete churn, {seconds:.0f}s per step; lag = apiserver answer -> event")
    for rate in rates:
        reached, received, lags = await churn_step(http, events, live, rate, seconds)
        ms = [lag * 1000 for lag in lags]
        print(
            f"    asked {rate:.0f}/s: requests {reached:.0f}/s, watcher events {received:.0f}/s, "
            f"lag p50 {percentile(ms, 50):.0f} ms p99 {percentile(ms, 99):.0f} ms "
            f"max {max(ms):.0f} ms",
            flush=True,
        )
        if percentile(lags, 99) > 1.0:
            print("    stopped: the watcher's lag p99 passed 1 s")
            break
        if reached < 0.8 * rate:
            print("    stopped: the apiserver (or this client) cannot take the pace")
            break
    return list(live)


def rss_mib(process: Any) -> float:
    for line in Path(f"/proc/{process.pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


async def start_control_plane(args: argparse.Namespace, work: Path) -> LocalCluster:
    nodes = default_nodes(args.nodes, cpu="64", memory="256Gi")
    print(f"starting a control plane with {len(nodes)} kwok nodes and nats-server ...", flush=True)
    started = time.perf_counter()
    cluster = LocalCluster(
        ClusterOptions(
            bin_dir=default_bin_dir(), state_dir=work / "k8s", nodes=nodes, start_timeout=600
        )
    )
    await asyncio.to_thread(cluster.start)
    print(f"control plane ready in {time.perf_counter() - started:.0f}s", flush=True)
    return cluster


async def run(args: argparse.Namespace) -> None:
    work = Path(tempfile.mkdtemp(prefix="tideshift-bench-"))
    cluster = await start_control_plane(args, work)
    nats = EmbeddedNats()
    nats.start()
    processes: list[Any] = []
    with cluster.api_client() as api_client:
        http = KubeHttp(api_client, timeout=(5.0, 60.0))
        http.json("POST", "/api/v1/namespaces", body={"metadata": {"name": NAMESPACE}})
        wait_until(
            lambda: any(
                sa["metadata"]["name"] == "default"
                for sa in http.get(f"/api/v1/namespaces/{NAMESPACE}/serviceaccounts")["items"]
            ),
            what="default ServiceAccount",
        )
        bus = await Bus.connect(nats.url, name="bench")
        await bus.ensure_streams()
        events = PodEvents()
        follower = asyncio.ensure_future(follow_pods(bus, events))
        try:
            processes.append(
                start_service(
                    "watcher", nats.url, cluster.kubeconfig_path, work, "--namespace", NAMESPACE
                )
            )
            # Warm-up: the watcher is up once it reports a pod.
            await asyncio.to_thread(
                http.json, "POST", f"/api/v1/namespaces/{NAMESPACE}/pods", body=bare_pod("warm-up")
            )
            await events.wait("added", "warm-up", timeout=120)
            await bench_pod_latency(http, events, args.samples)

            def restart_watcher() -> None:
                old = processes[0]
                old.terminate()
                old.wait(30)
                processes[0] = start_service(
                    "watcher",
                    nats.url,
                    cluster.kubeconfig_path,
                    work,
                    "--namespace",
                    NAMESPACE,
                    "--snapshot-bucket",
                    "bench_cold",
                )

            names = [f"load-{i}" for i in range(args.pods)]
            await create_pods(http, events, names)
            await bench_cold_start(restart_watcher, events, names)
            print(f"    watcher RSS with {args.pods} pods: {rss_mib(processes[0]):.0f} MiB")

            def start_executor(name: str, port: int, tree: Path) -> Any:
                kubeconfig = cluster.kubeconfig_path
                return start_service(name, nats.url, kubeconfig, work, health_port=port, tree=tree)

            trees = [
                (label, tree, samples or args.samples)
                for label, tree, samples in map(parse_tree, args.executor or ["this"])
            ]
            await compare_executors(bus, http, start_executor, trees)
            rates = [float(rate) for rate in args.churn_rates.split(",") if rate]
            names += await bench_churn(http, events, rates, args.churn_seconds)
            if not args.keep_pods:
                await delete_pods(http, events, names)
        finally:
            follower.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await follower
            await bus.close()
            for process in processes:
                process.terminate()
            for process in processes:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    process.wait(20)
            nats.stop()
            cluster.stop()
    print(f"service logs: {work}")


def parse_tree(value: str) -> tuple[str, Path, int | None]:
    """LABEL[=DIR][@SAMPLES]: another checkout (DIR) or this one, and its own sample count."""
    spec, _, samples = value.partition("@")
    label, _, tree = spec.partition("=")
    if not label or (tree and not Path(tree, "tideshift", "services").is_dir()):
        raise SystemExit(
            f"--executor {value}: expected LABEL[=DIR][@SAMPLES], DIR holding tideshift/services"
        )
    return label, Path(tree) if tree else ROOT, int(samples) if samples else None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=200, help="kwok nodes (default 200)")
    parser.add_argument("--pods", type=int, default=2000, help="pods for (c) (default 2000)")
    parser.add_argument("--samples", type=int, default=200, help="samples for (a), (b)")
    parser.add_argument(
        "--churn-rates", default="50,100,200,400", help="(d) requests/s per step, rising"
    )
    parser.add_argument("--churn-seconds", type=float, default=15.0, help="(d) each step")
    parser.add_argument(
        "--executor",
        action="append",
        default=[],
        metavar="LABEL[=DIR][@SAMPLES]",
        help="run (b) with each executor in turn: LABEL=DIR another checkout (git archive "
        "<commit> | tar -x -C DIR, and DIR/tideshift/{events,services,loadgen} linked to DIR's "
        "folders), LABEL alone this one; @SAMPLES its own sample count; repeatable (default: "
        "this one, labelled 'this')",
    )
    parser.add_argument(
        "--keep-pods", action="store_true", help="skip the final deletes (the cluster goes anyway)"
    )
    args = parser.parse_args()
    print(f"machine: {os.cpu_count()} cores; python {sys.version.split()[0]}")
    asyncio.run(run(args))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
