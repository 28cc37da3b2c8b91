"""Benchmark: the whole loop, forecast jump -> corrective scale visible in the apiserver.

Starts its own control plane (etcd, kube-apiserver, controller-manager, scheduler, kwok with
`--nodes` fake nodes) and nats-server, runs `tideshift run watcher`, `planner` and `executor`
as real processes, labels and annotates a serving Deployment (no settings name it), and
prints p50/p99 of:

(a) a forecast whose demand jumps, published on NATS -> the Deployment's new spec.replicas
    seen on an apiserver watch: watcher announcement, planner (leading edge), command on
    JetStream, executor, PUT of the scale subresource. Jumps are a second apart, so each
    is planned on the leading edge of its own burst;
(b) baseline, same run, interleaved with (a): a ScaleCommand published directly for an
    unlabelled Deployment -> replicas visible (the path without the planner), so (a) / (b)
    is what the planner adds.

Usage: .venv/bin/python tests/benchmarks/bench_loop_latency.py [--nodes 50] [--samples 40]
It asserts nothing about time; it prints figures.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from tests.benchmarks.bench_watch_scale import NAMESPACE, percentile, summary  # noqa: E402
from tests.k8s.cluster_objects import create, pod_template, wait_until  # noqa: E402
from tideshift.events import (  # noqa: E402
    FORECAST,
    SCALE_COMMAND,
    ForecastIssued,
    ForecastPoint,
    ScaleCommand,
    WorkloadRef,
)
from tideshift.services.cluster.adapters.http import KubeHttp  # noqa: E402
from tideshift.services.common.bus import Bus  # noqa: E402
from tideshift.services.common.embedded_nats import EmbeddedNats  # noqa: E402
from tideshift.services.devcluster.cluster import ClusterOptions, LocalCluster  # noqa: E402
from tideshift.services.devcluster.nodes import default_nodes  # noqa: E402
from tideshift.services.devcluster.versions import default_bin_dir  # noqa: E402

WEB = WorkloadRef(NAMESPACE, "Deployment.apps", "bench-web")  # labelled: the planner's
DIRECT = WorkloadRef(NAMESPACE, "Deployment.apps", "bench-direct")  # unlabelled: commands only
CAPACITY_RPS = 100.0
QUIET_S = 1.0  # between samples: pod events of the last change have died down

Seen = dict[tuple[str, int], list[float]]  # (deployment, spec.replicas) -> when each appeared


def start(name: str, nats_url: str, log_dir: Path, *extra: str) -> Any:
    log = (log_dir / f"{name}.log").open("wb")
    argv = [sys.executable, "-m", "tideshift.services.cli", "run", name]
    common = ["--nats-url", nats_url, "--health-port", "-1", "--log-level", "WARNING"]
    return subprocess.Popen([*argv, *common, *extra], stdout=log, stderr=subprocess.STDOUT)


def follow(http: KubeHttp, seen: Seen, stop: threading.Event) -> None:
    """Record when each Deployment's spec.replicas value appears, from an apiserver watch."""
    path = f"/apis/apps/v1/namespaces/{NAMESPACE}/deployments"
    version = http.get(path)["metadata"]["resourceVersion"]
    while not stop.is_set():
        query = [("watch", "true"), ("resourceVersion", version), ("timeoutSeconds", "60")]
        try:
            response = http.request("GET", path, query=query, timeout=(5, 90))
            for line in http.lines(response):
                now = time.perf_counter()
                obj = json.loads(line)["object"]
                version = obj["metadata"]["resourceVersion"]
                key = (obj["metadata"]["name"], int(obj["spec"]["replicas"]))
                seen.setdefault(key, []).append(now)
                if stop.is_set():
                    return
        except Exception:
            if not stop.is_set():
                raise


def deployment(ref: WorkloadRef, *, labelled: bool) -> dict[str, Any]:
    metadata: dict[str, Any] = {"name": ref.name}
    if labelled:
        metadata["labels"] = {"tideshift.io/role": "serving"}
        metadata["annotations"] = {
            "tideshift.io/capacity-rps": str(CAPACITY_RPS),
            "tideshift.io/min-replicas": "1",
            "tideshift.io/max-replicas": "50",
            "tideshift.io/lead-time-seconds": "0",
            "tideshift.io/stabilization-seconds": "0",
        }
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": metadata,
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": {"app": ref.name}},
            "template": pod_template({"app": ref.name}, cpu="100m"),
        },
    }


def forecast(rps: float) -> ForecastIssued:
    now = datetime.now(UTC)
    points = tuple(
        ForecastPoint(at=now + timedelta(minutes=k), point=rps, q50=rps, q90=rps, q95=rps, q99=rps)
        for k in range(10)
    )
    return ForecastIssued(
        workload=WEB, issued_at=now, step_seconds=60, model="bench", points=points
    )


async def until_seen(seen: Seen, key: tuple[str, int], before: int) -> float:
    deadline = time.perf_counter() + 30
    while len(seen.get(key, [])) <= before:
        if time.perf_counter() > deadline:
            raise TimeoutError(f"{key} never appeared")
        await asyncio.sleep(0.0005)
    return seen[key][before]


async def forecast_jump(bus: Bus, seen: Seen, replicas: int) -> float:
    """(a): publish a forecast needing `replicas`; seconds until the planner's scale shows."""
    key = (WEB.name, replicas)
    before = len(seen.get(key, []))
    started = time.perf_counter()
    await bus.publish(
        FORECAST.at(namespace=NAMESPACE, workload=WEB.name), forecast(replicas * CAPACITY_RPS)
    )
    return await until_seen(seen, key, before) - started


async def direct_command(bus: Bus, seen: Seen, replicas: int, index: int) -> float:
    """(b): publish the ScaleCommand itself; seconds until the scale shows."""
    key = (DIRECT.name, replicas)
    before = len(seen.get(key, []))
    command = ScaleCommand(
        target=DIRECT,
        desired=replicas,
        reason="benchmark baseline",
        plan_id=f"bench-{index}",
        issued_at=datetime.now(UTC),
        idempotency_key=f"bench-{os.getpid()}-{index}",
    )
    subject = SCALE_COMMAND.at(namespace=NAMESPACE, kind=DIRECT.kind, name=DIRECT.name)
    started = time.perf_counter()
    await bus.publish_durable(subject, command, msg_id=command.idempotency_key)
    return await until_seen(seen, key, before) - started


async def run(args: argparse.Namespace) -> None:
    work = Path(tempfile.mkdtemp(prefix="tideshift-bench-loop-"))
    nodes = default_nodes(args.nodes, cpu="64", memory="256Gi", gpu_nodes=0)
    print(f"starting a control plane with {len(nodes)} kwok nodes and nats-server ...", flush=True)
    cluster = LocalCluster(
        ClusterOptions(
            bin_dir=default_bin_dir(), state_dir=work / "k8s", nodes=nodes, start_timeout=300
        )
    )
    cluster.start()
    nats = EmbeddedNats()
    nats.start()
    kubeconfig = str(cluster.kubeconfig_path)
    processes: list[Any] = []
    stop = threading.Event()
    loop: list[float] = []
    direct: list[float] = []
    with cluster.api_client() as api_client:
        http = KubeHttp(api_client, timeout=(5.0, 60.0))
        create(http, "/api/v1/namespaces", {"metadata": {"name": NAMESPACE}})
        bus = await Bus.connect(nats.url, name="bench")
        await bus.ensure_streams()
        seen: Seen = {}
        try:
            watch_args = ("--kubeconfig", kubeconfig, "--namespace", NAMESPACE)
            processes.append(start("watcher", nats.url, work, *watch_args))
            processes.append(start("executor", nats.url, work, "--kubeconfig", kubeconfig))
            processes.append(start("planner", nats.url, work, "--tick-seconds", "30"))
            threading.Thread(target=follow, args=(http, seen, stop), daemon=True).start()
            deployments = f"/apis/apps/v1/namespaces/{NAMESPACE}/deployments"
            create(http, deployments, deployment(WEB, labelled=True))
            create(http, deployments, deployment(DIRECT, labelled=False))
            wait_until(lambda: (WEB.name, 1) in seen, what="the Deployment on the watch")
            # Warm-up: the first of each path waits for consumers, leases and connections.
            deadline = time.perf_counter() + 120
            while (WEB.name, 2) not in seen:
                if time.perf_counter() > deadline:
                    raise TimeoutError(f"the planner never acted; logs in {work}")
                await bus.publish(
                    FORECAST.at(namespace=NAMESPACE, workload=WEB.name), forecast(200.0)
                )
                await asyncio.sleep(0.5)
            await direct_command(bus, seen, 2, -1)
            # Interleaved, so both paths meet the same machine.
            for i in range(args.samples):
                await asyncio.sleep(QUIET_S)
                loop.append(await forecast_jump(bus, seen, 4 + 2 * (i % 2)))
                await asyncio.sleep(QUIET_S)
                direct.append(await direct_command(bus, seen, 4 + 2 * (i % 2), i))
        finally:
            stop.set()
            await bus.close()
            for process in processes:
                process.terminate()
            for process in processes:
                try:
                    process.wait(20)
                except subprocess.TimeoutExpired:
                    process.kill()
            nats.stop()
            cluster.stop()
    print(summary("(a) forecast jump on NATS -> new replicas visible (planner in the path)", loop))
    print(summary("(b) baseline: ScaleCommand on NATS -> replicas visible (no planner)", direct))
    for q in (50, 99):
        ratio = percentile(loop, q) / percentile(direct, q)
        print(f"    p{q} ratio (a)/(b): {ratio:.2f}")
    print(f"service logs: {work}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=50, help="kwok nodes (default 50)")
    parser.add_argument("--samples", type=int, default=40, help="samples of each (default 40)")
    args = parser.parse_args()
    load = ", ".join(f"{value:.1f}" for value in os.getloadavg())
    print(f"machine: {os.cpu_count()} cores, load average {load}; python {sys.version.split()[0]}")
    asyncio.run(run(args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
