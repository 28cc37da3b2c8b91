"""The chart's bundled NATS as a three-server cluster (`nats.bundled.replicas=3`), run for
real: the rendered config, its routes pointed at loopback, runs as three nats-server
processes that form one JetStream cluster, and the provisioning Job's command with the
Job's environment keeps every stream on all three."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.integration.security.test_chart_tls import _healthy
from tests.unit.chart.chart_support import CHART, HelmFailed, run_helm
from tideshift.services.common.bus import Bus
from tideshift.services.common.bus.permissions import ROLES, password_variable
from tideshift.services.common.bus.provision import stream_names
from tideshift.services.common.embedded_nats import find_nats_server
from tideshift.services.common.ports import free_port

TIDESHIFT = str(Path(sys.executable).parent / "tideshift")
CLUSTER_VALUES = ("--set", "nats.bundled.replicas=3")
SERVERS = 3


def rendered(*extra: str) -> list[dict[str, Any]]:
    out = run_helm("template", "ts", str(CHART), *extra).stdout
    return [doc for doc in yaml.safe_load_all(out) if doc]


def named(docs: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    return next(d for d in docs if d["kind"] == kind and d["metadata"]["name"].startswith(name))


def test_three_servers_start_together_behind_a_headless_service() -> None:
    docs = rendered(*CLUSTER_VALUES)
    statefulset = named(docs, "StatefulSet", "ts-tideshift-nats")
    assert statefulset["spec"]["replicas"] == SERVERS
    assert statefulset["spec"]["podManagementPolicy"] == "Parallel"
    headless = named(docs, "Service", "ts-tideshift-nats-headless")
    assert {"client", "cluster"} <= {port["name"] for port in headless["spec"]["ports"]}
    job = named(docs, "Job", "ts-tideshift-nats-provision")
    env = {
        e["name"]: e.get("value") for e in job["spec"]["template"]["spec"]["containers"][0]["env"]
    }
    assert env["TIDESHIFT_NATS_REPLICAS"] == "3"
    single = named(rendered(), "StatefulSet", "ts-tideshift-nats")
    assert single["spec"]["replicas"] == 1 and "podManagementPolicy" not in single["spec"]


def test_every_pod_that_creates_streams_asks_for_the_clusters_replicas() -> None:
    """The provisioning Job and every service (the executor creates its history stream):
    one TIDESHIFT_NATS_REPLICAS each, the cluster's size."""
    docs = rendered(*CLUSTER_VALUES)
    pods = [d["spec"]["template"]["spec"] for d in docs if d["kind"] in ("Deployment", "Job")]
    assert len(pods) >= 5
    for pod in pods:
        for container in pod["containers"]:
            names = [e["name"] for e in container["env"]]
            assert names.count("TIDESHIFT_NATS_REPLICAS") == 1, container["name"]
            replicas = next(e for e in container["env"] if e["name"] == "TIDESHIFT_NATS_REPLICAS")
            assert replicas["value"] == str(SERVERS), container["name"]


def test_an_even_cluster_is_refused_naming_the_value() -> None:
    with pytest.raises(HelmFailed) as failed:
        rendered("--set", "nats.bundled.replicas=2")
    assert "replicas" in failed.value.stderr


@pytest.fixture(scope="module")
def chart_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """The rendered config run by three nats-server processes, routes on loopback."""
    tmp = tmp_path_factory.mktemp("chart-cluster")
    text = named(rendered(*CLUSTER_VALUES), "ConfigMap", "ts-tideshift-nats")["data"]["nats.conf"]
    routes = [free_port() for _ in range(SERVERS)]
    for index, port in enumerate(routes):
        route = f"nats://ts-tideshift-nats-{index}.ts-tideshift-nats-headless.default.svc:6222"
        assert route in text
        text = text.replace(route, f"nats://127.0.0.1:{port}")
    passwords = {role: f"pw-{role}" for role in ROLES}
    env = {**os.environ} | {password_variable(r): p for r, p in passwords.items()}
    servers, clients, monitors = [], [], []
    try:
        for index, route in enumerate(routes):
            client, monitor = free_port(), free_port()
            mine = text
            for old, new in (
                ("store_dir: /data", f"store_dir: {tmp / f'store-{index}'}"),
                ("port: 4222", f"port: {client}"),
                ("http_port: 8222", f"http_port: {monitor}"),
                ("port: 1883", f"port: {free_port()}"),
                ("port: 6222", f"port: {route}"),
            ):
                assert old in mine
                mine = mine.replace(old, new)
            (tmp / f"nats-{index}.conf").write_text(mine)
            command = [str(find_nats_server()), "-c", str(tmp / f"nats-{index}.conf")]
            servers.append(
                subprocess.Popen(command, env=env | {"POD_NAME": f"ts-tideshift-nats-{index}"})
            )
            clients.append(client)
            monitors.append(monitor)
        deadline = time.monotonic() + 60
        while not all(_healthy(monitor) for monitor in monitors):
            assert all(s.poll() is None for s in servers), "nats-server refused the config"
            assert time.monotonic() < deadline, "the chart's cluster did not become healthy"
            time.sleep(0.1)
        yield {"url": ",".join(f"nats://127.0.0.1:{c}" for c in clients), "passwords": passwords}
    finally:
        for server in servers:
            server.terminate()
        for server in servers:
            server.wait(10)


def test_the_provisioning_job_keeps_every_stream_on_the_three_servers(
    chart_cluster: dict[str, Any],
) -> None:
    # The Job's command and environment: the provisioner's login and TIDESHIFT_NATS_REPLICAS.
    job_env = {
        "TIDESHIFT_NATS_URL": chart_cluster["url"],
        "TIDESHIFT_NATS_USER": "provisioner",
        "TIDESHIFT_NATS_PASSWORD": chart_cluster["passwords"]["provisioner"],
        "TIDESHIFT_NATS_REPLICAS": "3",
    }
    done = subprocess.run(
        [TIDESHIFT, "nats", "provision"],
        env={**os.environ, **job_env},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr

    async def replicas() -> dict[str, int]:
        bus = await Bus.connect(
            chart_cluster["url"],
            name="chart-cluster-check",
            user="provisioner",
            password=chart_cluster["passwords"]["provisioner"],
        )
        try:
            found = {}
            for name in stream_names():
                info = await bus.js.stream_info(name)
                found[name] = info.config.num_replicas
            return found
        finally:
            await bus.close()

    assert asyncio.run(replicas()) == dict.fromkeys(stream_names(), 3)
