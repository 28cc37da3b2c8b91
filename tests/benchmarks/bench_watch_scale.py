"""Benchmark: Kubernetes -> watcher -> NATS, and NATS -> executor -> Kubernetes.

Starts its own control plane (etcd, kube-apiserver, controller-manager, scheduler, kwok with
200 fake nodes) and nats-server, runs `tideshift run watcher` and `tideshift run executor` as
real processes, and prints:

(a) pod change in the apiserver -> PodChanged on NATS: p50/p99 (pod creations, one at a time)
(b) ScaleCommand on NATS -> new replicas visible in the apiserver (a watch): p50/p99
(c) watcher throughput while 2,000 pods are created, scheduled, started and deleted

Usage: .venv/bin/python tests/benchmarks/bench_watch_scale.py [--nodes 200] [--pods 2000]
It asserts nothing about time; it prints figures.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from kubernetes.client.exceptions import ApiException  # noqa: E402

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


def watch_replicas(http: KubeHttp, seen: dict[int, list[float]], stop: threading.Event) -> None:
    """Records when each Deployment spec.replicas value appears in the apiserver (a watch)."""
    path = f"/apis/apps/v1/namespaces/{NAMESPACE}/deployments"
    listing = http.get(path)
    version = listing["metadata"]["resourceVersion"]
    while not stop.is_set():
        response = http.request(
            "GET",
            path,
            query=[("watch", "true"), ("resourceVersion", version), ("timeoutSeconds", "60")],
            timeout=(5, 90),
        )
        for line in http.lines(response):
            now = time.perf_counter()
            event = json.loads(line)
            obj = event["object"]
            version = obj["metadata"]["resourceVersion"]
            if obj["metadata"].get("name") == "bench-web":
                seen.setdefault(int(obj["spec"]["replicas"]), []).append(now)
            if stop.is_set():
                return


def start_service(name: str, nats_url: str, kubeconfig: Path, log_dir: Path, *extra: str) -> Any:
    log = (log_dir / f"{name}.log").open("wb")
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
            "-1",
            "--log-level",
            "WARNING",
            *extra,
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        cwd=ROOT,
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


async def bench_scale_latency(bus: Bus, http: KubeHttp, samples: int) -> None:
    await asyncio.to_thread(
        create,
        http,
        f"/apis/apps/v1/namespaces/{NAMESPACE}/deployments",
        deployment("bench-web", 1),
    )
    seen: dict[int, list[float]] = {}
    stop = threading.Event()
    watcher = threading.Thread(target=watch_replicas, args=(http, seen, stop), daemon=True)
    watcher.start()
    await asyncio.sleep(0.5)
    latencies: list[float] = []
    target = WorkloadRef(kind="Deployment.apps", namespace=NAMESPACE, name="bench-web")
    subject = SCALE_COMMAND.at(namespace=NAMESPACE, kind=target.kind, name="bench-web")
    for i in range(samples):
        desired = 2 + (i % 2)  # alternate 2 and 3: always a real change
        before = len(seen.get(desired, []))
        command = ScaleCommand(
            target=target,
            desired=desired,
            reason="benchmark",
            plan_id=f"bench-{i}",
            issued_at=datetime.now(UTC),
            idempotency_key=f"bench-{os.getpid()}-{i}",
        )
        started = time.perf_counter()
        await bus.publish_durable(subject, command, msg_id=command.idempotency_key)
        deadline = started + 30
        while len(seen.get(desired, [])) <= before:
            if time.perf_counter() > deadline:
                raise TimeoutError(f"replicas {desired} never appeared")
            await asyncio.sleep(0.0005)
        latencies.append(seen[desired][before] - started)
    stop.set()
    print(summary("(b) ScaleCommand published -> replicas visible in the apiserver", latencies))
    # Context: the same machine's apiserver, asked directly (what the executor's path costs
    # beyond its two apiserver round trips is NATS, KV records and scheduling).
    direct: list[float] = []
    scale_path = f"/apis/apps/v1/namespaces/{NAMESPACE}/deployments/bench-web/scale"
    conflicts = 0
    for i in range(min(samples, 100)):
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
    print(summary("    baseline: GET + PUT of the scale subresource, directly", direct))
    print(f"    (baseline re-read after {conflicts} conflicts with the Deployment controller)")


async def bench_cold_start(restart_watcher: Any, events: PodEvents, names: list[str]) -> None:
    """A watcher started with an empty snapshot lists and publishes every pod at once."""
    for name in names:
        events.first_seen.pop(("added", name), None)
    started = time.perf_counter()
    await asyncio.to_thread(restart_watcher)
    for name in names:
        await events.wait("added", name, timeout=300)
    arrivals = [events.first_seen[("added", name)] for name in names]
    first, last = min(arrivals), max(arrivals)
    print(
        f"    cold start with {len(names)} pods (new snapshot bucket): process start to last "
        f"event {last - started:.1f}s; first to last event {last - first:.2f}s "
        f"= {len(names) / max(last - first, 1e-6):.0f} pods/s listed, converted and published"
    )


async def bench_throughput(
    http: KubeHttp, events: PodEvents, pods: int, restart_watcher: Any
) -> None:
    names = [f"load-{i}" for i in range(pods)]
    path = f"/api/v1/namespaces/{NAMESPACE}/pods"
    count_before = events.count
    started = time.perf_counter()
    with ThreadPoolExecutor(8) as pool:
        await asyncio.gather(
            *(
                asyncio.get_running_loop().run_in_executor(
                    pool, lambda n=name: http.json("POST", path, body=bare_pod(n))
                )
                for name in names
            )
        )
    created = time.perf_counter()
    for name in names:
        await events.wait("added", name, timeout=300)
    all_added = time.perf_counter()
    deadline = time.perf_counter() + 600
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
    await bench_cold_start(restart_watcher, events, names)
    count_before = events.count
    started = time.perf_counter()
    # One DELETE per pod from 8 threads, like the creation: a delete-collection of 2,000 pods
    # outlives the apiserver's 60 s request timeout on a busy 2-core machine.
    with ThreadPoolExecutor(8) as pool:
        await asyncio.gather(
            *(
                asyncio.get_running_loop().run_in_executor(
                    pool,
                    lambda n=name: http.json(
                        "DELETE", f"{path}/{n}", body={"gracePeriodSeconds": 0}
                    ),
                )
                for name in names
            )
        )
    deleted_call = time.perf_counter()
    everything = [*names]
    for name in everything:
        await events.wait("deleted", name, timeout=600)
    all_deleted = time.perf_counter()
    delete_events = events.count - count_before
    print(
        f"    {pods} deletes answered in {deleted_call - started:.1f}s; all {pods} 'deleted' "
        f"events by {all_deleted - started:.1f}s; {delete_events} events "
        f"= {delete_events / (all_deleted - started):.0f} events/s"
    )


async def run(args: argparse.Namespace) -> None:
    work = Path(tempfile.mkdtemp(prefix="tideshift-bench-"))
    nodes = default_nodes(args.nodes, cpu="64", memory="256Gi")
    print(f"starting a control plane with {len(nodes)} kwok nodes and nats-server ...", flush=True)
    started = time.perf_counter()
    cluster = LocalCluster(
        ClusterOptions(
            bin_dir=default_bin_dir(), state_dir=work / "k8s", nodes=nodes, start_timeout=300
        )
    )
    cluster.start()
    print(f"control plane ready in {time.perf_counter() - started:.0f}s", flush=True)
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
            processes.append(start_service("executor", nats.url, cluster.kubeconfig_path, work))
            # Warm-up: the watcher is up once it reports a pod.
            await asyncio.to_thread(
                http.json, "POST", f"/api/v1/namespaces/{NAMESPACE}/pods", body=bare_pod("warm-up")
            )
            await events.wait("added", "warm-up", timeout=120)
            await bench_pod_latency(http, events, args.samples)
            await bench_scale_latency(bus, http, args.samples)

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

            await bench_throughput(http, events, args.pods, restart_watcher)
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


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=200, help="kwok nodes (default 200)")
    parser.add_argument("--pods", type=int, default=2000, help="pods for (c) (default 2000)")
    parser.add_argument("--samples", type=int, default=200, help="samples for (a), (b)")
    args = parser.parse_args()
    print(f"machine: {os.cpu_count()} cores; python {sys.version.split()[0]}")
    asyncio.run(run(args))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
