"""The services start and become ready with exactly what the installed chart gives them: the
environment of their Deployment, the NATS URL from the chart's Secret, and (for the watcher
and executor) a token of the chart's ServiceAccount, so its ClusterRole must be enough.

kwok runs no containers, so the processes run here, as the pods would in a real cluster.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.image.chart_pods import container_environment, installed_deployments
from tests.unit.chart.chart_support import CHART, SERVICES, run_helm, values_args
from tideshift.services.common.embedded_nats import EmbeddedNats
from tideshift.services.common.ports import free_port

pytestmark = pytest.mark.k8s

WAIT = 90.0
KUBERNETES_SERVICES = ("watcher", "executor")


def process_environment(
    deployment: dict[str, Any], *, api: Any, namespace: str, health_port: int, home: Path
) -> dict[str, str]:
    """The container's environment as the kubelet would resolve it, on top of this host's."""
    env = {
        name: value
        for name, value in os.environ.items()
        if not name.startswith("TIDESHIFT_") and name != "KUBECONFIG"
    }
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    pod_name = f"{deployment['metadata']['name']}-local"
    env.update(container_environment(pod_name, container, api=api, namespace=namespace))
    # Many processes share this host: a free port stands in for the pod's own 8080.
    env["TIDESHIFT_HEALTH_PORT"] = str(health_port)
    env["TIDESHIFT_HEALTH_HOST"] = "127.0.0.1"
    env["HOME"] = str(home)
    env["MPLCONFIGDIR"] = str(home / "matplotlib")
    return env


def ready(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=2) as answer:
            return bool(answer.status == 200)
    except (urllib.error.URLError, OSError):
        return False


@contextlib.contextmanager
def running(service: str, env: dict[str, str], log: Path) -> Iterator[subprocess.Popen[bytes]]:
    with log.open("wb") as output:
        process = subprocess.Popen(
            [sys.executable, "-m", "tideshift.services.cli", "run", service],
            env=env,
            stdout=output,
            stderr=subprocess.STDOUT,
        )
    try:
        yield process
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout=40)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


def test_every_service_becomes_ready_with_the_chart_configuration(
    k8s_cluster: Any, k8s_namespace: str, nats_server: EmbeddedNats, tmp_path: Path
) -> None:
    release = f"ts-{uuid.uuid4().hex[:6]}"
    values = {
        "nats": {"bundled": {"enabled": False}, "url": nats_server.url},
        # A realistic minimum: one serving workload forecast (from the sim source: no
        # Prometheus here) and sized by the planner.
        "predictor": {
            "config": {"metric_source": "sim", "workloads": [{"namespace": "shop", "name": "web"}]}
        },
        "planner": {
            "config": {
                "serving": [{"namespace": "shop", "name": "web", "cpu": 0.5, "capacity_rps": 40}]
            }
        },
    }
    kube_env = {"KUBECONFIG": str(k8s_cluster.kubeconfig)}
    run_helm(
        "install",
        release,
        str(CHART),
        "-n",
        k8s_namespace,
        *values_args(values, tmp_path),
        env=kube_env,
    )
    try:
        deployments = installed_deployments(k8s_cluster.kubeconfig, release, k8s_namespace)
        assert set(deployments) == set(SERVICES)
        ports = {service: free_port("127.0.0.1") for service in SERVICES}
        with contextlib.ExitStack() as stack:
            api = stack.enter_context(k8s_cluster.api_client())
            processes = {}
            for service in SERVICES:
                env = process_environment(
                    deployments[service],
                    api=api,
                    namespace=k8s_namespace,
                    health_port=ports[service],
                    home=tmp_path / service,
                )
                assert env["TIDESHIFT_NATS_URL"] == nats_server.url, "URL from the Secret"
                if service in KUBERNETES_SERVICES:
                    account = deployments[service]["spec"]["template"]["spec"]["serviceAccountName"]
                    env["KUBECONFIG"] = str(
                        k8s_cluster.service_account_kubeconfig(
                            k8s_namespace, account, tmp_path / f"{service}.kubeconfig", create=False
                        )
                    )
                processes[service] = stack.enter_context(
                    running(service, env, tmp_path / f"{service}.log")
                )
            deadline = time.monotonic() + WAIT
            pending = set(SERVICES)
            while pending and time.monotonic() < deadline:
                for service in sorted(pending):
                    exited = processes[service].poll()
                    assert exited is None, (
                        f"{service} exited {exited}:\n{(tmp_path / f'{service}.log').read_text()}"
                    )
                    if ready(ports[service]):
                        pending.discard(service)
                time.sleep(0.2)
            logs = {s: (tmp_path / f"{s}.log").read_text()[-3000:] for s in sorted(pending)}
            assert not pending, f"not ready within {WAIT:.0f}s: {logs}"
            for process in processes.values():
                process.send_signal(signal.SIGTERM)
            codes = {service: process.wait(timeout=40) for service, process in processes.items()}
        assert codes == dict.fromkeys(SERVICES, 0), "every service drains and exits 0 on SIGTERM"
    finally:
        run_helm("uninstall", release, "-n", k8s_namespace, env=kube_env, check=False)
