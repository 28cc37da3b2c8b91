"""The real services as processes on a real nats-server and the local control plane, scraped
by a real Prometheus that also evaluates the chart's alerts: what the dashboard and alert
tests (and the dashboard picture, tests/benchmarks/bench_dashboard_png.py) query.

The watcher announces a labelled serving Deployment `web` and a training Job `train`; the
predictor forecasts `web` from the rate exporter's `http_requests_total{app="web"}`, which the
caller drives with `set_rate`; the planner plans both and the executor scales them.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import urllib.parse
import urllib.request
import uuid
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.fixtures.prometheus import PrometheusServer, RateExporter
from tests.k8s.cluster_objects import (
    collection,
    create,
    end_processes,
    pipeline_kubeconfigs,
    pod_template,
    wait_until,
)
from tideshift.services.cluster.adapters.http import KubeHttp
from tideshift.services.common.embedded_nats import EmbeddedNats
from tideshift.services.common.ports import free_port

REPO = Path(__file__).resolve().parents[3]
DASHBOARD = REPO / "charts" / "tideshift" / "dashboards" / "tideshift.json"
ALERTS = REPO / "charts" / "tideshift" / "dashboards" / "alerts.yaml"
SERVICES = ("watcher", "predictor", "planner", "executor")
SERVING = {
    "tideshift.io/capacity-rps": "100",
    "tideshift.io/min-replicas": "1",
    "tideshift.io/max-replicas": "12",
    "tideshift.io/lead-time-seconds": "0",
    "tideshift.io/stabilization-seconds": "30",
}
# The dashboard's Grafana variables, as a query over the whole run would resolve them.
GRAFANA_VARIABLES = {"$__rate_interval": "1m", "$namespace": ".*"}


def tideshift(*args: str) -> list[str]:
    return [sys.executable, "-m", "tideshift.services.cli", *args]


def dashboard_queries() -> list[tuple[str, str, str]]:
    """(panel title, legend, PromQL with the Grafana variables resolved) of every target."""
    document = json.loads(DASHBOARD.read_text())
    return [
        (panel["title"], target.get("legendFormat", ""), resolve(target["expr"]))
        for panel in document["panels"]
        for target in panel["targets"]
    ]


def resolve(expr: str) -> str:
    for variable, value in GRAFANA_VARIABLES.items():
        expr = expr.replace(variable, value)
    return expr


SELECTOR = re.compile(r"\b(tideshift_[a-z_]+)(\{[^}]*\})?")


def selectors(expr: str) -> list[str]:
    """The vector selectors (metric name and matchers) an expression reads."""
    return sorted({name + (matchers or "") for name, matchers in SELECTOR.findall(expr)})


@dataclass
class Stack:
    namespace: str
    nats_url: str
    admin: KubeHttp
    exporter: RateExporter
    prometheus: PrometheusServer
    logs: Path
    ports: dict[str, int] = field(default_factory=dict)
    processes: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)

    def set_rate(self, requests_per_second: float) -> None:
        self.exporter.set_rate(requests_per_second)

    def alive(self) -> None:
        dead = [name for name, p in self.processes.items() if p.poll() is not None]
        assert not dead, f"{dead} exited; logs in {self.logs}"

    def api(self, path: str, **params: str) -> Any:
        """GET the Prometheus HTTP API; the `data` of a success, else an AssertionError."""
        url = f"{self.prometheus.url}/api/v1/{path}?{urllib.parse.urlencode(params)}"
        with urllib.request.urlopen(url, timeout=10) as reply:
            body = json.load(reply)
        assert body["status"] == "success", f"{path} {params}: {body}"
        return body["data"]

    def query(self, expr: str) -> list[dict[str, Any]]:
        data = self.api("query", query=expr)
        assert data["resultType"] == "vector", f"{expr}: {data['resultType']}"
        return list(data["result"])

    def query_range(
        self, expr: str, *, start: float, end: float, step: float
    ) -> list[dict[str, Any]]:
        data = self.api("query_range", query=expr, start=f"{start}", end=f"{end}", step=f"{step}")
        return list(data["result"])

    def eventually(self, check: Any, what: str, timeout: float = 120.0) -> Any:
        def checked() -> Any:
            self.alive()
            return check()

        return wait_until(checked, timeout=timeout, what=what)


def _argvs(stack: Stack, kubeconfig: dict[str, str]) -> dict[str, list[str]]:
    def common(service: str) -> list[str]:
        return [
            "--nats-url",
            stack.nats_url,
            "--health-host",
            "127.0.0.1",
            "--health-port",
            str(stack.ports[service]),
            "--instance",
            f"{service}-0",
        ]

    return {
        "watcher": tideshift(
            "run", "watcher", *common("watcher"), "--kubeconfig", kubeconfig["watcher"],
            "--namespace", stack.namespace,
        ),
        "predictor": tideshift(
            "run", "predictor", *common("predictor"), "--prometheus-url", stack.prometheus.url,
            "--model", "drift", "--step-seconds", "5", "--history-seconds", "600",
            "--horizon-seconds", "300", "--refit-seconds", "30", "--observe-seconds", "2",
        ),
        "planner": tideshift(
            "run", "planner", *common("planner"), "--tick-seconds", "1",
            "--debounce-seconds", "0.2", "--min-trainer-lifetime-s", "0",
            # Minutes stand for hours here: scale-down looks one minute ahead, not 15.
            "--release-horizon-s", "60",
        ),
        "executor": tideshift(
            "run", "executor", *common("executor"), "--kubeconfig", kubeconfig["executor"],
            "--no-batch-resources",
        ),
    }  # fmt: skip


def _prometheus_config(server: PrometheusServer, stack: Stack) -> None:
    """Scrape the exporter and every service; evaluate the chart's alerts."""
    targets = [stack.exporter.target, *(f"127.0.0.1:{port}" for port in stack.ports.values())]
    config = {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "rule_files": [str(ALERTS)],
        "scrape_configs": [{"job_name": "tideshift", "static_configs": [{"targets": targets}]}],
    }
    server.config_file.write_text(json.dumps(config))


def create_labelled(
    admin: KubeHttp,
    namespace: str,
    *,
    serving: dict[str, str],
    training: dict[str, str],
    trainer_cpu: str,
    replicas: int = 1,
) -> None:
    """A serving Deployment `web` and a training Job `train`, labelled and annotated."""
    web = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {
            "name": "web",
            "labels": {"tideshift.io/role": "serving"},
            "annotations": serving,
        },
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": "web"}},
            "template": pod_template({"app": "web"}, cpu="1"),
        },
    }
    create(admin, collection("Deployment", namespace), web)
    trainer = pod_template({"app": "train"}, cpu=trainer_cpu)
    trainer["spec"]["restartPolicy"] = "Never"
    train = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": "train",
            "labels": {"tideshift.io/role": "training"},
            "annotations": training,
        },
        "spec": {"parallelism": 1, "template": trainer},
    }
    create(admin, collection("Job", namespace), train)


@contextmanager
def monitored_stack(
    k8s_cluster: Any, prometheus_binary: str, workdir: Path, *, initial_rate: float = 0.0
) -> Iterator[Stack]:
    """Everything started, the workloads created; torn down on exit. With `initial_rate`, the
    services start once Prometheus sees that demand (no ramp from zero to forecast from)."""
    namespace = f"t-obs-{uuid.uuid4().hex[:6]}"
    logs = workdir / "logs"
    logs.mkdir(parents=True)
    with ExitStack() as stop:
        api_client = stop.enter_context(k8s_cluster.api_client())
        nats = stop.enter_context(EmbeddedNats())
        admin = KubeHttp(api_client)
        create(admin, "/api/v1/namespaces", {"metadata": {"name": namespace}})
        stop.callback(admin.json, "DELETE", f"/api/v1/namespaces/{namespace}")
        kubeconfig = pipeline_kubeconfigs(admin, k8s_cluster, namespace, logs)
        exporter = RateExporter(workdir)
        exporter.set_rate(initial_rate)
        exporter.start()
        stop.callback(exporter.stop)
        (workdir / "prometheus").mkdir()
        prometheus = PrometheusServer(prometheus_binary, workdir / "prometheus", targets=[])
        stack = Stack(namespace, nats.url, admin, exporter, prometheus, logs)
        stack.ports = {service: free_port() for service in SERVICES}
        _prometheus_config(prometheus, stack)
        prometheus.start()
        stop.callback(prometheus.stop)
        if initial_rate > 0:
            stack.eventually(lambda: _rate(stack) >= 0.95 * initial_rate, "the initial demand")
        for name, argv in _argvs(stack, kubeconfig).items():
            handle = stop.enter_context((logs / f"{name}.log").open("ab"))
            stack.processes[name] = subprocess.Popen(
                argv, stdin=subprocess.DEVNULL, stdout=handle, stderr=handle
            )
        stop.callback(end_processes, list(stack.processes.values()))
        training = {"tideshift.io/min-replicas": "1", "tideshift.io/max-replicas": "6"}
        create_labelled(admin, namespace, serving=SERVING, training=training, trainer_cpu="4")
        yield stack


def _rate(stack: Stack) -> float:
    result = stack.query('sum(rate(http_requests_total{app="web"}[1m]))')
    return float(result[0]["value"][1]) if result else 0.0


def wait_for_scrapes(stack: Stack) -> None:
    """Every service's /metrics scraped successfully."""

    def all_up() -> bool:
        up = {r["metric"]["instance"]: r["value"][1] for r in stack.query("up")}
        return all(up.get(f"127.0.0.1:{port}") == "1" for port in stack.ports.values())

    stack.eventually(all_up, "every service scraped", timeout=90)
