"""`tideshift trace export` and `tideshift whatif` against a real Prometheus holding three weeks
of history (a shared trace backfilled with `promtool tsdb create-blocks-from openmetrics`) and
the local control plane's nodes and labelled workloads."""

from __future__ import annotations

import csv
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from tests.fixtures.requirements import missing_dependency
from tests.integration.observability.stack import create_labelled
from tests.k8s.cluster_objects import wait_until
from tideshift.loadgen.traces import read_trace
from tideshift.services.cluster.adapters.http import KubeHttp
from tideshift.services.common.ports import free_port
from tideshift.services.simulator.scenario import load_scenario

pytestmark = [pytest.mark.slow, pytest.mark.prometheus, pytest.mark.timeout(600)]

TRACE = Path("/work/shared/traces/nasa_http_jul95_1min.csv")
DAYS = 21
SCALE = 100  # the trace's ~40 requests a minute, as a site serving ~70 req/s
HOLE = (10 * 86_400, 10 * 86_400 + 2 * 3600)  # seconds into the history with no samples
QUERY = 'sum(rate(http_requests_total{app="web"}[5m]))'


def tideshift(*args: str) -> list[str]:
    return [sys.executable, "-m", "tideshift.services.cli", *args]


def openmetrics(out: Path, *, end: float) -> None:
    """The trace's last DAYS days as a counter ending at `end`, with the HOLE left out."""
    trace = read_trace(TRACE)
    rows = int(DAYS * 86_400 / trace.interval_s)
    counts = trace.counts[-rows:]
    start = end - rows * trace.interval_s
    total = 0.0
    lines = ["# HELP http_requests Requests served.", "# TYPE http_requests counter"]
    for k, count in enumerate(counts):
        total += count * SCALE
        offset = k * trace.interval_s
        if not HOLE[0] <= offset < HOLE[1]:
            lines.append(f'http_requests_total{{app="web"}} {total:.0f} {start + offset:.0f}')
    out.write_text("\n".join([*lines, "# EOF"]) + "\n")


@contextmanager
def backfilled_prometheus(prometheus_binary: str, workdir: Path) -> Iterator[str]:
    """A Prometheus serving DAYS days of the trace, backfilled with promtool: its base URL."""
    promtool = shutil.which("promtool")
    if promtool is None:
        missing_dependency("promtool is missing: install the Debian package `prometheus`")
    source, data = workdir / "web.om", workdir / "data"
    openmetrics(source, end=time.time() - 60)
    subprocess.run(
        [promtool, "tsdb", "create-blocks-from", "openmetrics", str(source), str(data)],
        check=True,
        capture_output=True,
        timeout=300,
    )
    port = free_port()
    (workdir / "prometheus.yml").write_text("global: {scrape_interval: 15s}\n")
    with (workdir / "prometheus.log").open("ab") as log:
        server = subprocess.Popen(
            [
                prometheus_binary,
                f"--config.file={workdir / 'prometheus.yml'}",
                f"--storage.tsdb.path={data}",
                "--storage.tsdb.retention.time=60d",
                f"--web.listen-address=127.0.0.1:{port}",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until(lambda: ready(url, server), timeout=120, what="prometheus on the backfill")
        yield url
    finally:
        server.terminate()
        server.wait(30)


@pytest.fixture(scope="module")
def history(prometheus_binary: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with backfilled_prometheus(prometheus_binary, tmp_path_factory.mktemp("history")) as url:
        yield url


def ready(url: str, server: subprocess.Popen[bytes]) -> bool:
    assert server.poll() is None, "prometheus exited"
    try:
        with urllib.request.urlopen(f"{url}/-/ready", timeout=2) as reply:
            return bool(reply.status == 200)
    except (urllib.error.URLError, OSError):
        return False


def create_workloads(admin: KubeHttp, namespace: str) -> None:
    """A serving Deployment whose demand query reads the history, and a training Job."""
    serving = {
        "tideshift.io/capacity-rps": "20",
        "tideshift.io/max-replicas": "20",
        "tideshift.io/lead-time-seconds": "60",
        "tideshift.io/demand-query": QUERY,
    }
    training = {"tideshift.io/min-replicas": "1", "tideshift.io/max-replicas": "8"}
    create_labelled(
        admin, namespace, serving=serving, training=training, trainer_cpu="2", replicas=2
    )


@pytest.fixture
def labelled(k8s_cluster: Any, k8s_namespace: str) -> str:
    with k8s_cluster.api_client() as api_client:
        create_workloads(KubeHttp(api_client), k8s_namespace)
    return k8s_namespace


def test_trace_export_writes_the_history_as_a_trace_and_reports_the_gap(
    history: str, tmp_path: Path
) -> None:
    out = tmp_path / "web.csv"
    result = subprocess.run(
        tideshift(
            "trace", "export", "--prometheus", history, "--query", QUERY,
            "--since", "14d", "--step", "1m", "--out", str(out),
        ),
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    trace = read_trace(out)
    assert trace.interval_s == 60
    assert len(trace.counts) in (14 * 1440, 14 * 1440 + 1)
    # ~40 requests a minute x SCALE: the trace's level, not zeros or a unit mix-up.
    mean = sum(trace.counts) / len(trace.counts)
    assert 1000 < mean < 10_000, mean
    # Chunks of at most 10,000 steps: 20,160 steps take three.
    assert "fetched 3/3 chunks" in result.stderr
    # The two-hour hole, seven days before the end of the 21: reported and interpolated.
    gaps = [line for line in result.stderr.splitlines() if "gap:" in line]
    assert len(gaps) == 1, result.stderr
    steps = int(gaps[0].split("gap: ")[1].split(" step")[0])
    assert 100 <= steps <= 120, gaps


def test_whatif_replays_the_clusters_history_against_every_policy(
    history: str, labelled: str, k8s_cluster: Any, tmp_path: Path
) -> None:
    out = tmp_path / "whatif"
    result = subprocess.run(
        tideshift(
            "whatif", "--prometheus", history, "--kubeconfig", str(k8s_cluster.kubeconfig),
            "--namespace", labelled, "--since", "14d", "--history", "1d", "--step", "10m",
            "--model", "seasonal_naive_daily", "--out", str(out),
        ),
        capture_output=True, text=True, timeout=500, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("On your last 14d, Tideshift would have used ")
    rows = {line.split()[0] for line in result.stdout.splitlines() if line.strip()}
    assert {"tideshift", "static", "hpa", "edl"} <= rows
    for policy in ("tideshift", "static", "hpa", "edl"):
        assert (out / f"whatif-{policy}.png").stat().st_size > 10_000
    scenario = load_scenario(out / "scenario.yaml")
    assert sum(group.count for group in scenario.nodes) == len(k8s_cluster.nodes)
    assert scenario.duration_s == 14 * 86_400
    (web,) = scenario.serving
    assert (web.name, web.capacity_rps, web.max_replicas) == ("web", 20, 20)
    (job,) = scenario.training.jobs
    assert (job.name_prefix, job.trainer.cpu, job.max_trainers) == ("train", 2, 8)
    with (out / "traces" / "web.csv").open() as trace:
        assert len(list(csv.reader(trace))) - 1 in (15 * 144, 15 * 144 + 1)
    assert "simulating tideshift" in result.stderr


def test_whatif_without_a_reachable_prometheus_says_what_to_check(
    labelled: str, k8s_cluster: Any, tmp_path: Path
) -> None:
    result = subprocess.run(
        tideshift(
            "whatif", "--prometheus", f"http://127.0.0.1:{free_port()}",
            "--kubeconfig", str(k8s_cluster.kubeconfig), "--namespace", labelled,
            "--out", str(tmp_path),
        ),
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert result.returncode == 2
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("tideshift whatif: cannot query Prometheus at http://127.0.0.1:")
    assert "check --prometheus" in last
