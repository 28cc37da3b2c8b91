"""The compressed day on the real cluster (tests/real/test_real_day.py): its shape, its
Kubernetes objects, the Prometheus it starts in the control plane's network namespace, the
sampler that follows the pods, and the figures it draws.

Everything measured here is measured on real pods: the sample app's replicas behind a Service,
the load generator in a pod sending through that Service, trainers training the built-in
logistic regression (`tideshift run trainer`, the trainer SDK) on the synthetic click log.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import textwrap
import threading
import time
import urllib.parse
import urllib.request
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from tests.fixtures.requirements import REPOSITORY
from tests.real.realcluster import IMAGE, PREFIX, RealCluster
from tideshift.loadgen.core.profiles import DiurnalProfile
from tideshift.services.trainer.core.model import DatasetSpec, dataset_uris

NAMESPACE = "real-day"
RELEASE = "tideshift"
CP_IP = "10.250.0.1"  # tests/cluster/real/cluster.sh: the control plane's bridge address
PROMETHEUS_PORT = 9090
APIFORWARD = REPOSITORY / "tests" / "cluster" / "real" / "apiforward.py"
DAY_S = 86_400.0


def control_node() -> str:
    """Tideshift's own pods (NATS, the services), the coordinator, the pserver and the load
    generator run here; the node lost in the fault is another one."""
    return f"{PREFIX}-node-0"


@dataclass(frozen=True)
class DayShape:
    """The compressed day: `day_s` wall seconds of a diurnal profile."""

    day_s: float
    peak_rps: float = 100.0
    trough_rps: float = 20.0
    peak_hour: float = 14.0
    # Serving: the planner sizes replicas at `capacity_rps`; the app itself serves
    # `app_capacity_rps` within its latency target, so a replica at the planned load is
    # busy two thirds of the time and queueing alone sheds almost nothing.
    capacity_rps: float = 8.0
    app_capacity_rps: float = 12.0
    service_time_s: float = 0.25
    latency_target_s: float = 0.75
    web_cpu_m: int = 250
    min_replicas: int = 2
    # The peak needs 13; 14 x 250m leaves the trainers' minimum room on three 2-core nodes
    # beside Tideshift and the harness (20 let serving preempt the last trainer at the peak).
    max_replicas: int = 14
    # Measured start of a replica on these nodes (schedule, start, import, ready) is 3-8 s;
    # the lead time also covers a lost node's detection (node-monitor-grace-period 20 s).
    lead_time_s: float = 30.0
    margin_s: float = 10.0
    stabilization_s: float = 20.0
    # Training: the trainer SDK's example model; each shard held >= `shard_s`.
    trainer_cpu_m: int = 500
    min_trainers: int = 1
    max_trainers: int = 6
    shard_s: float = 4.0
    epochs: int = 2
    samples_per_shard: int = 2000
    batch_size: int = 500
    # Faults, as fractions of the day: a node lost (its kubelet and pods; back after
    # `node_down_s`), a trainer pod deleted mid-shard, the leading planner pod deleted.
    node_loss_at: float = 0.30
    node_down_s: float = 35.0
    trainer_kill_at: float = 0.55
    planner_kill_at: float = 0.75

    @property
    def speed(self) -> float:
        return DAY_S / self.day_s

    @property
    def shards(self) -> int:
        """Work for about three trainers through the whole day: the job is still running
        at the day's last scale-down."""
        return max(8, math.ceil(3.0 * self.day_s / (self.shard_s * self.epochs)))

    @property
    def batches_per_shard(self) -> int:
        return -(-self.samples_per_shard // self.batch_size)

    @property
    def total_batches(self) -> int:
        return self.epochs * self.shards * self.batches_per_shard

    def profile(self) -> DiurnalProfile:
        return DiurnalProfile(
            peak_rps=self.peak_rps, trough_rps=self.trough_rps, peak_hour=self.peak_hour
        )

    def demand(self, since_start_s: float) -> float:
        return self.profile().rate(since_start_s * self.speed)

    def need(self, since_start_s: float) -> int:
        """Replicas the demand needs at the planned per-replica capacity."""
        return max(self.min_replicas, math.ceil(self.demand(since_start_s) / self.capacity_rps))

    def dataset(self) -> DatasetSpec:
        return DatasetSpec(
            num_shards=self.shards,
            samples_per_shard=self.samples_per_shard,
            batch_size=self.batch_size,
        )


def day_shape_from_env() -> DayShape:
    """`TIDESHIFT_REAL_DAY_SECONDS` wall seconds (default 180, a short day;
    `make test-real` runs 720)."""
    raw = os.environ.get("TIDESHIFT_REAL_DAY_SECONDS", "180")
    try:
        seconds = float(raw)
    except ValueError:
        raise ValueError(f"TIDESHIFT_REAL_DAY_SECONDS: expected seconds, got {raw!r}") from None
    if not 120 <= seconds <= 86_400:
        raise ValueError(f"TIDESHIFT_REAL_DAY_SECONDS: expected 120..86400 seconds, got {raw!r}")
    return DayShape(day_s=seconds)


# ---- the chart's values ---------------------------------------------------------------------


def chart_values(shape: DayShape, nats_image: str, predictor_image: str) -> dict[str, Any]:
    """The chart as a user installs it in act mode, tuned to the compressed day: the forecast
    grid in seconds (a wall minute is `speed` minutes of the day), the planner every 2 s."""

    def split(image: str) -> dict[str, str]:
        repository, _, tag = image.rpartition(":")
        return {"repository": repository, "tag": tag}

    pinned = {"kubernetes.io/hostname": control_node()}
    scraped = {"prometheus.io/scrape": "true", "prometheus.io/port": "8080"}
    return {
        "image": {**split(IMAGE), "pullPolicy": "Never"},
        "nats": {
            "auth": {"enabled": NATS_AUTH},
            "bundled": {
                "enabled": True,
                "replicas": 1,
                "image": {**split(nats_image), "pullPolicy": "Never"},
                "persistence": {"enabled": False},
                "nodeSelector": pinned,
            },
        },
        "watcher": {"nodeSelector": pinned, "config": {"resync_seconds": 30.0}},
        "predictor": {
            "image": split(predictor_image),
            "nodeSelector": pinned,
            "podAnnotations": scraped,
            "config": {
                "metric_source": "prometheus",
                "prometheus_url": f"http://{CP_IP}:{PROMETHEUS_PORT}",
                "query_template": 'sum(rate(http_requests_total{app="$name"}[10s]))',
                "step_seconds": 5.0,
                "horizon_seconds": 120.0,
                "history_seconds": 3600.0,
                "refit_seconds": 60.0,
                "refresh_seconds": 2.0,
                "observe_seconds": 2.0,
                "stale_after_seconds": 30.0,
            },
        },
        "planner": {
            "nodeSelector": pinned,
            "podAnnotations": scraped,
            "config": {
                "tick_seconds": 2.0,
                "debounce_seconds": 0.5,
                "max_forecast_age_s": 30.0,
                "observed_max_age_seconds": 10.0,
                "resend_seconds": 10.0,
                "lease_ttl_seconds": 6.0,
                "min_trainer_lifetime_s": 10.0,
                "panic_window_s": 10.0,
                "rise_window_s": shape.day_s,
                "release_horizon_s": 15.0,
            },
        },
        "executor": {"nodeSelector": pinned, "config": {"mode": "act"}},
    }


# ---- the workloads ------------------------------------------------------------------------


def _tolerations() -> list[dict[str, Any]]:
    """A pod of a lost node is replaced 2 s after the node is marked unreachable (the
    default, 300 s, would leave the day short of it for five minutes)."""
    return [
        {"key": key, "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 2}
        for key in ("node.kubernetes.io/unreachable", "node.kubernetes.io/not-ready")
    ]


# NATS logins stay off for the day: with them on, the chart's permission table lets the
# `coordinator` role neither ask the pservers for their status (publish to
# tideshift.v1.training.pserver.*.*.*: refused, the job never finishes an epoch) nor the
# `planner` role read scale results (subscribe to tideshift.v1.scale.result.*.*.*: refused),
# both seen on this cluster. The helm lifecycle test installs with logins on.
NATS_AUTH = False


def _nats_env(role: str) -> list[dict[str, Any]]:
    """The URL from the chart's Secret; with logins on, the role's login too, as the chart's
    own pods get it (the bus reads TIDESHIFT_NATS_USER/PASSWORD)."""

    def secret(name: str, key: str) -> dict[str, Any]:
        return {"secretKeyRef": {"name": name, "key": key}}

    login: list[dict[str, Any]] = [
        {"name": "TIDESHIFT_NATS_USER", "value": role},
        {"name": "TIDESHIFT_NATS_PASSWORD", "valueFrom": secret(f"{RELEASE}-nats-users", role)},
    ]
    return [
        {"name": "TIDESHIFT_NATS_URL", "valueFrom": secret(f"{RELEASE}-nats", "url")},
        *(login if NATS_AUTH else []),
        {"name": "TIDESHIFT_INSTANCE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
    ]


def _container(name: str, command: list[str], cpu_m: int, **extra: Any) -> dict[str, Any]:
    return {
        "name": name,
        "image": IMAGE,
        "imagePullPolicy": "Never",
        "command": command,
        "resources": {"requests": {"cpu": f"{cpu_m}m", "memory": "96Mi"}},
        **extra,
    }


def priority_classes() -> list[dict[str, Any]]:
    """Serving may preempt trainers, nothing else: it runs at the default priority (0) like
    Tideshift's own pods and the harness (the load generator, coordinator, pserver), which
    it must never push out; trainers run below it."""
    return [
        {
            "apiVersion": "scheduling.k8s.io/v1",
            "kind": "PriorityClass",
            "metadata": {"name": f"{NAMESPACE}-{name}"},
            "value": value,
        }
        for name, value in (("serving", 0), ("training", -100))
    ]


def web(shape: DayShape) -> list[dict[str, Any]]:
    """The sample app as a Deployment Tideshift serves (label and annotations) and its Service."""
    # A 1 s probe timeout flaps replicas out of the Service on a machine this loaded.
    ready = {"httpGet": {"path": "/healthz", "port": 8080}, "periodSeconds": 1, "timeoutSeconds": 3}
    deployment = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {
            "name": "web",
            "namespace": NAMESPACE,
            "labels": {"tideshift.io/role": "serving"},
            "annotations": {
                "tideshift.io/capacity-rps": str(shape.capacity_rps),
                "tideshift.io/min-replicas": str(shape.min_replicas),
                "tideshift.io/max-replicas": str(shape.max_replicas),
                "tideshift.io/lead-time-seconds": str(shape.lead_time_s),
                "tideshift.io/margin-seconds": str(shape.margin_s),
                "tideshift.io/stabilization-seconds": str(shape.stabilization_s),
            },
        },
        "spec": {
            "replicas": shape.need(0.0),
            "selector": {"matchLabels": {"app": "web"}},
            "template": {
                "metadata": {
                    "labels": {"app": "web", "tideshift.io/role": "serving"},
                    "annotations": {"prometheus.io/scrape": "true", "prometheus.io/port": "8080"},
                },
                "spec": {
                    "priorityClassName": f"{NAMESPACE}-serving",
                    "terminationGracePeriodSeconds": 5,
                    "tolerations": _tolerations(),
                    "enableServiceLinks": False,
                    "topologySpreadConstraints": [
                        {
                            "maxSkew": 1,
                            "topologyKey": "kubernetes.io/hostname",
                            "whenUnsatisfiable": "ScheduleAnyway",
                            "labelSelector": {"matchLabels": {"app": "web"}},
                        }
                    ],
                    "containers": [
                        _container(
                            "web",
                            [
                                "tideshift",
                                "serve-sample",
                                "--app",
                                "web",
                                "--host",
                                "0.0.0.0",
                                "--port",
                                "8080",
                                "--capacity-rps",
                                str(shape.app_capacity_rps),
                                "--service-time-s",
                                str(shape.service_time_s),
                                "--latency-target-s",
                                str(shape.latency_target_s),
                            ],
                            shape.web_cpu_m,
                            ports=[{"containerPort": 8080}],
                            readinessProbe=ready,
                        )
                    ],
                },
            },
        },
    }
    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": "web", "namespace": NAMESPACE},
        "spec": {"selector": {"app": "web"}, "ports": [{"port": 80, "targetPort": 8080}]},
    }
    return [deployment, service]


def training(shape: DayShape) -> list[dict[str, Any]]:
    """The elastic job: its coordinator (a Job), one pserver and the trainers, a StatefulSet
    Tideshift scales (label and annotations)."""
    pinned = {"kubernetes.io/hostname": control_node()}
    scraped = {"prometheus.io/scrape": "true", "prometheus.io/port": "8080"}
    dataset = json.dumps(dataset_uris(shape.dataset()))
    coordinator = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": "ctr-coordinator", "namespace": NAMESPACE},
        "spec": {
            "backoffLimit": 4,
            "template": {
                "metadata": {"labels": {"app": "ctr-coordinator"}, "annotations": scraped},
                "spec": {
                    "restartPolicy": "OnFailure",
                    "nodeSelector": pinned,
                    "enableServiceLinks": False,
                    "containers": [
                        _container(
                            "coordinator",
                            [
                                "tideshift",
                                "run",
                                "coordinator",
                                "--job",
                                "ctr",
                                "--epochs",
                                str(shape.epochs),
                                "--pservers",
                                "1",
                                "--dataset",
                                dataset,
                                "--optimizer",
                                '{"kind": "adagrad", "learning_rate": 0.1}',
                            ],
                            100,
                            env=_nats_env("coordinator"),
                        )
                    ],
                },
            },
        },
    }
    pserver = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "ctr-pserver", "namespace": NAMESPACE},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": {"app": "ctr-pserver"}},
            "template": {
                "metadata": {"labels": {"app": "ctr-pserver"}},
                "spec": {
                    "nodeSelector": pinned,
                    "enableServiceLinks": False,
                    "containers": [
                        _container(
                            "pserver",
                            ["tideshift", "run", "pserver", "--job", "ctr", "--index", "0"],
                            100,
                            env=_nats_env("pserver"),
                        )
                    ],
                },
            },
        },
    }
    trainers = {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": {
            "name": "ctr",
            "namespace": NAMESPACE,
            "labels": {"tideshift.io/role": "training"},
            "annotations": {
                "tideshift.io/min-replicas": str(shape.min_trainers),
                "tideshift.io/max-replicas": str(shape.max_trainers),
            },
        },
        "spec": {
            "replicas": shape.min_trainers,
            "serviceName": "ctr",
            "podManagementPolicy": "Parallel",
            "selector": {"matchLabels": {"app": "ctr"}},
            "template": {
                "metadata": {"labels": {"app": "ctr", "tideshift.io/role": "training"}},
                "spec": {
                    "priorityClassName": f"{NAMESPACE}-training",
                    # SIGTERM: the batch in hand finishes, the rest of the shard goes back.
                    "terminationGracePeriodSeconds": 10,
                    "tolerations": _tolerations(),
                    "enableServiceLinks": False,
                    "containers": [
                        _container(
                            "trainer",
                            [
                                "tideshift",
                                "run",
                                "trainer",
                                "--job",
                                "ctr",
                                "--min-task-seconds",
                                str(shape.shard_s),
                                "--grace-seconds",
                                "8",
                                "--health-port",
                                "8080",
                            ],
                            shape.trainer_cpu_m,
                            env=_nats_env("trainer"),
                            readinessProbe={
                                "httpGet": {"path": "/readyz", "port": 8080},
                                "periodSeconds": 1,
                                "timeoutSeconds": 3,
                            },
                        )
                    ],
                },
            },
        },
    }
    return [coordinator, pserver, trainers]


# The load generator's pod: the project's open-loop driver (loadgen/driver.py) and diurnal
# profile, through the Service's DNS name; one JSON line per wall second (this window's
# answers, failures by kind and latency percentiles), starting at `start_at` (wall clock).
LOADGEN_SCRIPT = textwrap.dedent(
    """
    import asyncio, json, sys, time
    from tideshift.loadgen.core.profiles import DiurnalProfile
    from tideshift.loadgen.driver import DriverConfig, check_target, drive, in_cluster_names
    cfg = json.loads(sys.argv[1])
    check_target(cfg["target"], allowed_hosts=in_cluster_names(cfg["service"]))
    profile = DiurnalProfile(**cfg["profile"])
    while time.time() < cfg["start_at"]:
        time.sleep(min(0.2, cfg["start_at"] - time.time()))
    late = time.time() - cfg["start_at"]
    seen = {"latencies": 0, "ok": 0, "failures": {}}
    def window(stats, profile_time):
        lat = sorted(stats.latencies_s[seen["latencies"]:])
        seen["latencies"] = len(stats.latencies_s)
        failures = {k: v - seen["failures"].get(k, 0) for k, v in stats.failures.items()}
        seen["failures"] = dict(stats.failures)
        ok, seen["ok"] = stats.succeeded - seen["ok"], stats.succeeded
        pick = lambda q: lat[min(len(lat) - 1, int(q * len(lat)))] if lat else None
        print(json.dumps({"t": time.time(), "profile_s": profile_time, "ok": ok,
                          "failures": {k: v for k, v in failures.items() if v},
                          "p50": pick(0.5), "p99": pick(0.99), "dropped": stats.dropped}),
              flush=True)
    config = DriverConfig(target=cfg["target"], duration_s=cfg["day_s"] - late,
                          speed=cfg["speed"], profile_start_s=late * cfg["speed"],
                          max_in_flight=512, timeout_s=5.0, seed=1)
    stats = asyncio.run(drive(profile, config, on_progress=window, progress_every_s=1.0))
    print(json.dumps({"summary": stats.summary()}), flush=True)
    """
)


def loadgen(shape: DayShape, start_at: float) -> dict[str, Any]:
    config = {
        "target": f"http://web.{NAMESPACE}.svc.cluster.local/",
        "service": f"web.{NAMESPACE}",
        "profile": {
            "peak_rps": shape.peak_rps,
            "trough_rps": shape.trough_rps,
            "peak_hour": shape.peak_hour,
        },
        "start_at": start_at,
        "day_s": shape.day_s,
        "speed": shape.speed,
    }
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "loadgen", "namespace": NAMESPACE},
        "spec": {
            "restartPolicy": "Never",
            "nodeSelector": {"kubernetes.io/hostname": control_node()},
            "enableServiceLinks": False,
            "containers": [
                _container("loadgen", ["python", "-c", LOADGEN_SCRIPT, json.dumps(config)], 200)
            ],
        },
    }


def manifest(objects: list[dict[str, Any]]) -> str:
    return "\n---\n".join(json.dumps(o) for o in objects)


# ---- Prometheus, in the control plane's network namespace ---------------------------------


def prometheus_config(targets_file: Path) -> str:
    """Every pod of the day's namespace annotated prometheus.io/scrape. Debian's Prometheus
    is built without kubernetes_sd: the Sampler, which lists the pods every second anyway,
    keeps a file_sd file of them (pod IP and annotated port, labelled with the pod's name)."""
    return textwrap.dedent(
        f"""
        global: {{scrape_interval: 1s, evaluation_interval: 1s}}
        scrape_configs:
          - job_name: pods
            file_sd_configs:
              - files: [{targets_file}]
                refresh_interval: 1s
        """
    )


def scrape_targets(pods: list[Any]) -> list[dict[str, Any]]:
    """file_sd entries of the running pods annotated prometheus.io/scrape (kubernetes client
    objects)."""
    targets = []
    for pod in pods:
        annotations = pod.metadata.annotations or {}
        if annotations.get("prometheus.io/scrape") != "true" or not pod.status.pod_ip:
            continue
        if pod.status.phase != "Running" or pod.metadata.deletion_timestamp is not None:
            continue
        targets.append(
            {
                "targets": [f"{pod.status.pod_ip}:{annotations.get('prometheus.io/port', '8080')}"],
                "labels": {"pod": pod.metadata.name},
            }
        )
    return sorted(targets, key=lambda t: t["labels"]["pod"])


class Prometheus:
    """A real Prometheus inside the cluster's control-plane namespace at 10.250.0.1:9090 (the
    pods reach it there), its history backfilled with compressed days of the same profile,
    and a loopback port on the host for the test (apiforward.py, as the API server's)."""

    def __init__(self, cluster: RealCluster, work: Path) -> None:
        self.cluster = cluster
        self.work = work
        self.processes: list[subprocess.Popen[bytes]] = []
        self.url = ""
        self.targets_file = work / "targets.json"
        self.targets_file.write_text("[]")

    def start(self, shape: DayShape, start_at: float) -> None:
        from tideshift.services.demo.kube_machine import history_openmetrics

        binary = shutil.which("prometheus")
        promtool = shutil.which("promtool")
        assert binary and promtool, "prometheus/promtool missing: `make system-deps`"
        data = self.work / "prometheus-data"
        data.mkdir(parents=True)
        history = self.work / "history.om"
        # Compressed days up to the day's start, as the kube demo backfills: at least the
        # predictor's history_seconds (an hour of wall time).
        days = max(2, math.ceil(3600 / shape.day_s))
        history.write_text(
            history_openmetrics(shape.profile(), speed=shape.speed, end_wall=start_at, days=days)
        )
        subprocess.run(
            [promtool, "tsdb", "create-blocks-from", "openmetrics", str(history), str(data)],
            check=True,
            capture_output=True,
            timeout=300,
        )
        config = self.work / "prometheus.yml"
        config.write_text(prometheus_config(self.targets_file))
        netns = f"/run/netns/{PREFIX}-cp"
        log = (self.work / "prometheus.log").open("wb")
        self.processes.append(
            subprocess.Popen(
                [
                    "nsenter",
                    f"--net={netns}",
                    "--",
                    binary,
                    f"--config.file={config}",
                    f"--storage.tsdb.path={data}",
                    f"--web.listen-address={CP_IP}:{PROMETHEUS_PORT}",
                    "--storage.tsdb.retention.time=2d",
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        )
        port_file = self.work / "prometheus.port"
        self.processes.append(
            subprocess.Popen(
                [
                    "python3",
                    str(APIFORWARD),
                    "--netns",
                    netns,
                    "--target",
                    f"{CP_IP}:{PROMETHEUS_PORT}",
                    "--port-file",
                    str(port_file),
                ],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
        )
        deadline = time.monotonic() + 60
        while True:
            try:
                if port_file.exists() and port_file.read_text().strip():
                    self.url = f"http://127.0.0.1:{port_file.read_text().strip()}"
                    with urllib.request.urlopen(self.url + "/-/ready", timeout=2):
                        return
            except OSError:
                pass
            assert time.monotonic() < deadline, (self.work / "prometheus.log").read_text()[-2000:]
            time.sleep(0.5)

    def query_range(self, query: str, start: float, end: float, step: float = 2.0) -> list[Any]:
        params = urllib.parse.urlencode({"query": query, "start": start, "end": end, "step": step})
        with urllib.request.urlopen(f"{self.url}/api/v1/query_range?{params}", timeout=30) as r:
            answer = json.loads(r.read())
        assert answer["status"] == "success", answer
        result: list[Any] = answer["data"]["result"]
        return result

    def stop(self) -> None:
        for process in reversed(self.processes):
            process.terminate()
        for process in self.processes:
            try:
                process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(timeout=5)


# ---- following the pods --------------------------------------------------------------------


@dataclass
class Sample:
    t: float
    web_ready: int  # Ready serving pods as the API server shows them
    web_live: int  # ... less those on a node the test stopped (their processes are gone)
    web_ordered: int  # the Deployment's spec.replicas (what the executor last wrote)
    trainers_ready: int
    trainers_ordered: int
    web_nodes: dict[str, int] = field(default_factory=dict)


class Sampler:
    """Lists the day's pods once a second in a thread (the kubernetes client, the admin
    kubeconfig), counting a stopped node's pods as gone from the moment it stopped."""

    def __init__(self, cluster: RealCluster, targets_file: Path) -> None:
        from kubernetes import client, config

        api = config.new_client_from_config(config_file=str(cluster.kubeconfig))  # type: ignore[no-untyped-call]
        self.core = client.CoreV1Api(api)
        self.apps = client.AppsV1Api(api)
        self.samples: list[Sample] = []
        self.errors: list[str] = []
        self.dead_nodes: set[str] = set()
        self.targets_file = targets_file
        self._targets: list[dict[str, Any]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="sampler", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.ident is not None:
            self._thread.join(timeout=30)

    def _run(self) -> None:
        while not self._stop.is_set():
            began = time.time()
            try:
                self.samples.append(self.sample())
            except Exception as error:  # the API server under load: note it, keep sampling
                self.errors.append(f"{time.time():.0f}: {type(error).__name__}: {error}"[:300])
            self._stop.wait(max(0.05, 1.0 - (time.time() - began)))

    def sample(self) -> Sample:
        now = time.time()
        pods: list[Any] = self.core.list_namespaced_pod(NAMESPACE, _request_timeout=10).items
        dead = set(self.dead_nodes)
        targets = scrape_targets([p for p in pods if p.spec.node_name not in dead])
        if targets != self._targets:
            partial = self.targets_file.with_suffix(".partial")
            partial.write_text(json.dumps(targets))
            partial.replace(self.targets_file)  # Prometheus never reads half a file
            self._targets = targets

        def ready(pod: Any) -> bool:
            if pod.metadata.deletion_timestamp is not None or pod.status.conditions is None:
                return False
            return any(c.type == "Ready" and c.status == "True" for c in pod.status.conditions)

        web = [p for p in pods if (p.metadata.labels or {}).get("app") == "web" and ready(p)]
        trainers = [p for p in pods if (p.metadata.labels or {}).get("app") == "ctr" and ready(p)]
        nodes: dict[str, int] = {}
        for pod in web:
            nodes[pod.spec.node_name] = nodes.get(pod.spec.node_name, 0) + 1
        deployment: Any = self.apps.read_namespaced_deployment(
            "web", NAMESPACE, _request_timeout=10
        )
        stateful: Any = self.apps.read_namespaced_stateful_set(
            "ctr", NAMESPACE, _request_timeout=10
        )
        return Sample(
            t=now,
            web_ready=len(web),
            web_live=sum(1 for p in web if p.spec.node_name not in dead),
            web_ordered=deployment.spec.replicas,
            trainers_ready=sum(1 for p in trainers if p.spec.node_name not in dead),
            trainers_ordered=stateful.spec.replicas,
            web_nodes=nodes,
        )


# ---- figures --------------------------------------------------------------------------------


def longest_shortfall(samples: list[Sample], shape: DayShape, start_at: float) -> float:
    """The longest stretch (seconds) in which fewer live replicas were ready than demand
    needed, over the day."""
    longest, began = 0.0, None
    for sample in samples:
        since = sample.t - start_at
        if not 0 <= since <= shape.day_s:
            continue
        short = sample.web_live < shape.need(since)
        if short and began is None:
            began = sample.t
        if not short and began is not None:
            longest, began = max(longest, sample.t - began), None
    if began is not None:
        longest = max(longest, samples[-1].t - began)
    return longest


def write_outputs(
    out: Path,
    shape: DayShape,
    start_at: float,
    samples: list[Sample],
    windows: list[dict[str, Any]],
    batches: list[tuple[float, float]],
    faults: dict[str, float],
    figures: dict[str, Any],
) -> Path:
    """real-day.json (the figures and the series) and real-day.png (four panels, as the
    demo's): demand against ready replicas, latency and errors through the Service, trainers,
    batches applied."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out.mkdir(parents=True, exist_ok=True)

    def hours(t: float) -> float:
        return (t - start_at) * shape.speed / 3600

    (out / "real-day.json").write_text(
        json.dumps(
            {
                "shape": {**asdict(shape), "speed": shape.speed, "shards": shape.shards},
                "figures": figures,
                "faults_h": {k: round(hours(v), 2) for k, v in faults.items()},
                "samples": [asdict(s) for s in samples],
                "windows": windows,
                "batches": batches,
            },
            indent=1,
        )
        + "\n"
    )
    fig, axes = plt.subplots(4, 1, figsize=(10, 11), sharex=True)
    day = [s for s in samples if 0 <= s.t - start_at <= shape.day_s]
    xs = [hours(s.t) for s in day]
    ax = axes[0]
    ax.plot(
        xs,
        [shape.demand(s.t - start_at) / shape.capacity_rps for s in day],
        "k-",
        label="demand / capacity per replica",
    )
    ax.step(xs, [shape.need(s.t - start_at) for s in day], "k:", where="post", label="need")
    ax.step(xs, [s.web_ordered for s in day], "C1-", where="post", label="replicas ordered")
    ax.step(xs, [s.web_live for s in day], "C0-", where="post", label="replicas ready (live)")
    ax.set_ylabel("serving replicas")
    ax.legend(loc="upper left", fontsize=8)
    ax = axes[1]
    wx = [hours(w["t"]) for w in windows]
    ax.plot(wx, [(w["p50"] or 0) * 1000 for w in windows], "C0-", label="p50 latency")
    ax.plot(wx, [(w["p99"] or 0) * 1000 for w in windows], "C1-", label="p99 latency")
    ax.set_ylabel("latency (ms)")
    twin = ax.twinx()
    twin.bar(
        wx,
        [sum(w["failures"].values()) for w in windows],
        width=0.05,
        color="C3",
        label="errors / s",
    )
    twin.set_ylabel("errors per second", color="C3")
    ax.legend(loc="upper left", fontsize=8)
    ax = axes[2]
    ax.step(xs, [s.trainers_ordered for s in day], "C1-", where="post", label="trainers ordered")
    ax.step(xs, [s.trainers_ready for s in day], "C2-", where="post", label="trainers ready")
    ax.set_ylabel("trainers")
    ax.legend(loc="upper left", fontsize=8)
    ax = axes[3]
    ax.plot(
        [hours(t) for t, _ in batches],
        [b for _, b in batches],
        "C2-",
        label="batches applied (pserver)",
    )
    ax.axhline(shape.total_batches, color="k", ls=":", label="the job's batches")
    ax.set_ylabel("batches")
    ax.set_xlabel("hour of the compressed day")
    ax.legend(loc="upper left", fontsize=8)
    for ax in axes:
        for name, t in faults.items():
            ax.axvline(hours(t), color="C3", ls="--", lw=0.8)
            if ax is axes[0]:
                ax.annotate(
                    name,
                    (hours(t), ax.get_ylim()[1]),
                    fontsize=7,
                    color="C3",
                    rotation=90,
                    va="top",
                    ha="right",
                )
        ax.set_xlim(0, max(24.0, *(hours(t) for t, _ in batches[-1:])))
    fig.suptitle(
        f"tideshift on a real cluster (measured): a day in {shape.day_s:.0f} s "
        f"({shape.speed:.0f}x), {len(day)} samples"
    )
    fig.tight_layout()
    path = out / "real-day.png"
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path
