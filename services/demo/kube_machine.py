"""What the real-cluster demo uses on this machine: the cluster it reaches (or starts), the
Prometheus it runs and backfills, and its child processes. No decision about the world."""

from __future__ import annotations

import contextlib
import math
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from tideshift.loadgen.core.profiles import RateProfile
from tideshift.services.core.constants import DAY_S
from tideshift.services.demo.errors import DemoError
from tideshift.services.demo.kube_objects import APP


@dataclass
class ClusterAccess:
    kubeconfig: Path
    started: Any = None  # a LocalCluster this run started (stopped at the end)


def resolve_cluster(kubeconfig: str | None) -> ClusterAccess:
    """The kubeconfig to use; starts the local control plane when nothing else is there."""
    if kubeconfig is not None:
        return ClusterAccess(Path(kubeconfig))
    env = os.environ.get("KUBECONFIG")
    if env and Path(env.split(os.pathsep)[0]).exists():
        return ClusterAccess(Path(env.split(os.pathsep)[0]))
    from tideshift.services.devcluster.cluster import (
        ADMIN_KUBECONFIG,
        ClusterOptions,
        ClusterStartError,
        LocalCluster,
    )
    from tideshift.services.devcluster.nodes import default_nodes
    from tideshift.services.devcluster.processes import load_state, record_alive, state_processes
    from tideshift.services.devcluster.versions import (
        MissingBinariesError,
        cache_root,
        default_bin_dir,
        stale_binaries,
    )

    state_dir = cache_root() / "devcluster"
    state = load_state(state_dir)
    if state is not None and all(record_alive(r) for r in state_processes(state)):
        return ClusterAccess(state_dir / ADMIN_KUBECONFIG)
    bin_dir = default_bin_dir()
    missing = stale_binaries(bin_dir)
    if missing:
        raise DemoError(
            f"no cluster: $KUBECONFIG is unset, no `tideshift dev cluster` is running, and the "
            f"Go-built binaries to start one are missing in {bin_dir} ({', '.join(missing)}); "
            "build them with `make k8s-binaries` (or pass --cluster PATH to a kubeconfig)"
        )
    cluster = LocalCluster(
        ClusterOptions(bin_dir=bin_dir, nodes=default_nodes(4, cpu="8", memory="32Gi"))
    )
    try:
        cluster.start()
    except (MissingBinariesError, ClusterStartError) as error:
        first = str(error).splitlines()[0] if str(error) else type(error).__name__
        raise DemoError(f"could not start the local control plane: {first}") from None
    return ClusterAccess(cluster.kubeconfig_path, started=cluster)


def require_prometheus() -> str:
    found = shutil.which("prometheus")
    if found is None:
        raise DemoError(
            "the real-cluster demo needs Prometheus: install the Debian package "
            "(`sudo apt-get install prometheus`, or `make system-deps`)"
        )
    return found


@dataclass
class Children:
    log_dir: Path
    processes: list[tuple[str, subprocess.Popen[bytes], IO[bytes]]] = field(default_factory=list)

    def start(self, name: str, argv: list[str], *, env: dict[str, str] | None = None) -> None:
        self.log_dir.mkdir(parents=True, exist_ok=True)
        handle = (self.log_dir / f"{name}.log").open("ab")
        # Children run this interpreter, so they import the same installed `tideshift`.
        environment = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
        process = subprocess.Popen(
            argv, stdin=subprocess.DEVNULL, stdout=handle, stderr=handle, env=environment
        )
        self.processes.append((name, process, handle))

    def failed(self) -> list[str]:
        return [
            f"{name} (exit {process.returncode}, log {self.log_dir / (name + '.log')})"
            for name, process, _ in self.processes
            if process.poll() is not None
        ]

    def stop(self, grace: float = 15.0) -> None:
        for _, process, _ in reversed(self.processes):
            if process.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    process.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + grace
        for _, process, handle in self.processes:
            try:
                process.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
            handle.close()


def tideshift(*args: str) -> list[str]:
    return [sys.executable, "-m", "tideshift.services.cli", *args]


def wait_http(url: str, *, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url, timeout=1.0) as answer:
                if answer.status == 200:
                    return
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(0.2)
    raise DemoError(f"{what} did not answer at {url} within {timeout:.0f}s")


STARTUP_TIMEOUT_S = 180.0
HISTORY_DAYS = 3  # compressed days of demand backfilled into Prometheus before the run


def history_openmetrics(
    profile: RateProfile, *, speed: float, end_wall: float, days: int = HISTORY_DAYS
) -> str:
    """The sample app's request counter over the `days` compressed days before `end_wall`.

    A fresh Prometheus knows nothing, and a forecaster fitted on seconds of data guesses
    wildly; real deployments have weeks of history. Wall time t maps to profile time
    (t - end_wall) * speed, the same mapping the load generator uses from the start on.
    """
    span = days * DAY_S / speed
    step = max(1.0, round(span / 20_000.0))
    lines = [
        "# HELP http_requests HTTP requests answered by the sample app (backfilled history)",
        "# TYPE http_requests counter",
    ]
    total = 0.0
    t = float(math.floor(end_wall - span))
    while t < end_wall - 1:
        total += profile.rate((t - end_wall) * speed) * step
        lines.append(f'http_requests_total{{app="{APP}",code="200"}} {total:.3f} {t:.0f}')
        t += step
    lines.append("# EOF")
    return "\n".join(lines) + "\n"


def backfill_prometheus(promtool: str, data_dir: Path, metrics: str) -> None:
    source = data_dir.parent / "history.om"
    source.write_text(metrics)
    done = subprocess.run(
        [promtool, "tsdb", "create-blocks-from", "openmetrics", str(source), str(data_dir)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    if done.returncode != 0:
        raise DemoError(f"promtool could not backfill the demand history: {done.stderr[-300:]}")


def prometheus_config(app_port: int) -> str:
    return (
        "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
        "scrape_configs:\n"
        "  - job_name: sample-app\n"
        f"    static_configs:\n      - targets: ['127.0.0.1:{app_port}']\n"
    )
