"""Upgrade without loss (issue 40, item 5): the previous release's chart and code installed,
a workload run, then `helm upgrade` in place to this tree with a rolling restart of every
service; streams, KV buckets, rise history and decision history are kept, and no scale
command is lost or applied twice across the rollout.

The previous release is commit `PREVIOUS_RELEASE` (there are no git tags: 757ad34 is the last
commit before the development round of issue 40). Its tree is taken with `git archive` and
installed as its image would install it (`pip install` of the tree, the current venv's
dependencies beside it) into a venv cached by commit under ~/.cache/tideshift/releases/, about a
minute the first time.

Where it runs: the local control plane with kwok, as tests/k8s/test_helm_services.py runs the
chart: kwok runs no containers, so each Deployment's container runs here as a process with
the environment the kubelet would give it (Secrets read, the pod's name filled in), from the
old tree before the upgrade and this tree after; the chart's NATS provisioning Job is run the
same way for each revision. That costs seconds to start where the real-node cluster
(tests/real) costs minutes of cluster and image builds, and what the upgrade can lose lives in
NATS and the apiserver, which are real here. A rolling update is played as Kubernetes plays
it with maxSurge 1: each new process ready before its old one gets SIGTERM.

4-7 minutes on the shared 2-core machine (a cached release), so it runs in `make test-chaos`
only (TIDESHIFT_CHAOS_TIER=1), not in `make test`.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import itertools
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.chaos.stored import read_stored
from tests.fixtures.support import answers_ready
from tests.image.chart_pods import container_environment
from tests.k8s.cluster_objects import collection, create, pod_template
from tests.unit.chart.chart_support import CHART, run_helm, values_args
from tideshift import events
from tideshift.events import EXECUTOR_RECORDS_BUCKET, PINS_BUCKET, RISE_HISTORY_BUCKET
from tideshift.services.cluster.adapters.http import KubeHttp
from tideshift.services.common.bus import DEAD_LETTER_STREAM, SCALE_STREAM, Bus
from tideshift.services.common.bus.streams import HISTORY_STREAM
from tideshift.services.common.embedded_nats import EmbeddedNats
from tideshift.services.common.ports import free_port

pytestmark = [
    pytest.mark.k8s,
    pytest.mark.chaos,
    pytest.mark.timeout(1200),
    pytest.mark.skipif(
        not os.environ.get("TIDESHIFT_CHAOS_TIER"),
        reason="the chaos tier (4-7 minutes, over make test's budget): make test-chaos",
    ),
]

PREVIOUS_RELEASE = "757ad3488f5915a285aee71b4adb83728e5c9014"
ROOT = Path(__file__).resolve().parents[2]
RELEASES = (
    Path(os.environ.get("TIDESHIFT_CACHE", Path.home() / ".cache" / "tideshift")) / "releases"
)
WAIT = 90.0
# A pod's start on a loaded machine (imports, the first list, a predictor's first fit).
START_WAIT = 300.0
ROLL_ORDER = ("watcher", "predictor", "executor", "planner")
RATES = (50.0, 120.0, 80.0, 200.0, 30.0, 150.0)  # req/s forecast for `web`, in turn
CAPACITY_RPS = 10.0
COMMANDS_PER_PHASE = 3  # applied before the upgrade, and again after it
SERVING = {
    "tideshift.io/capacity-rps": str(CAPACITY_RPS),
    "tideshift.io/min-replicas": "1",
    "tideshift.io/max-replicas": "40",
    "tideshift.io/lead-time-seconds": "0",
    "tideshift.io/stabilization-seconds": "1",
}


# -- the previous release ------------------------------------------------------------------


@dataclass(frozen=True)
class Release:
    """A release's chart and the `tideshift` command its image would run."""

    chart: Path
    tideshift: Path


def current_release() -> Release:
    return Release(CHART, Path(sys.executable).parent / "tideshift")


def previous_release(commit: str = PREVIOUS_RELEASE) -> Release:
    """The tree of `commit`, installed in a venv of its own; built once per commit (a lock
    keeps two sessions from building it at once; a half-built one is never used)."""
    home = RELEASES / commit
    ready = home / "installed"
    release = Release(home / "src" / "charts" / "tideshift", home / "venv" / "bin" / "tideshift")
    if ready.exists():
        return release
    RELEASES.mkdir(parents=True, exist_ok=True)
    with (RELEASES / f"{commit}.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if ready.exists():
            return release
        shutil.rmtree(home, ignore_errors=True)
        (home / "src").mkdir(parents=True)
        archive = subprocess.run(
            ["git", "-C", str(ROOT), "archive", commit], check=True, capture_output=True
        ).stdout
        subprocess.run(["tar", "-x", "-C", str(home / "src")], input=archive, check=True)
        base = Path(getattr(sys, "_base_executable", sys.executable))
        subprocess.run([str(base), "-m", "venv", "--without-pip", str(home / "venv")], check=True)
        site = subprocess.run(
            [str(home / "venv" / "bin" / "python"), "-c", "import sysconfig; "
             "print(sysconfig.get_paths()['purelib'])"],
            check=True, capture_output=True, text=True,
        ).stdout.strip()  # fmt: skip
        # The dependencies: this venv's site-packages (its own editable tideshift is not read
        # from there: .pth files are processed in site directories only).
        mine = subprocess.run(
            [sys.executable, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            check=True, capture_output=True, text=True,
        ).stdout.strip()  # fmt: skip
        Path(site, "tideshift-dependencies.pth").write_text(mine + "\n")
        subprocess.run(
            [sys.executable, "-m", "pip", "--python", str(home / "venv" / "bin" / "python"),
             "install", "-q", "--no-deps", str(home / "src")],
            check=True, cwd=home,
        )  # fmt: skip
        ready.touch()
    return release


# -- the chart's objects run as processes ----------------------------------------------------


def installed_objects(kubeconfig: Path, release: str, namespace: str) -> list[dict[str, Any]]:
    manifest = run_helm(
        "get", "manifest", release, "-n", namespace, env={"KUBECONFIG": str(kubeconfig)}
    ).stdout
    return [doc for doc in yaml.safe_load_all(manifest) if doc]


def component(obj: dict[str, Any]) -> str:
    return str(obj["metadata"]["labels"]["app.kubernetes.io/component"])


@dataclass
class Pod:
    name: str
    process: subprocess.Popen[bytes]
    health_port: int
    log: Path

    def ready(self) -> bool:
        assert self.process.poll() is None, f"{self.name} exited: {self.tail()}"
        return answers_ready(self.health_port)

    def tail(self) -> str:
        return self.log.read_text(errors="replace")[-3000:]

    def terminate(self) -> int:
        """SIGTERM, as the kubelet stops a replaced pod; its exit code."""
        self.process.send_signal(signal.SIGTERM)
        try:
            return self.process.wait(40)
        except subprocess.TimeoutExpired:
            self.process.kill()
            return self.process.wait()


@dataclass
class Kubelet:
    """Runs the chart's containers here: kwok only pretends to."""

    k8s_cluster: Any
    api: Any
    namespace: str
    logs: Path
    pods: list[Pod] = field(default_factory=list)

    def environment(self, pod_name: str, spec: dict[str, Any]) -> dict[str, str]:
        container = spec["containers"][0]
        env = {
            name: value
            for name, value in os.environ.items()
            if not name.startswith("TIDESHIFT_") and name != "KUBECONFIG"
        }
        env.update(
            container_environment(pod_name, container, api=self.api, namespace=self.namespace)
        )
        home = self.logs / pod_name
        home.mkdir(exist_ok=True)
        env["HOME"], env["MPLCONFIGDIR"] = str(home), str(home / "matplotlib")
        account = spec.get("serviceAccountName")
        if spec.get("automountServiceAccountToken", True) and account:
            path = self.logs / f"{pod_name}.kubeconfig"
            env["KUBECONFIG"] = str(
                self.k8s_cluster.service_account_kubeconfig(
                    self.namespace, account, path, create=False
                )
            )
        return env

    def job(self, release: Release, job: dict[str, Any], pod_name: str) -> None:
        """Run a Job's container to completion (the NATS provisioning)."""
        spec = job["spec"]["template"]["spec"]
        env = self.environment(pod_name, spec)
        env.pop("KUBECONFIG", None)
        args = spec["containers"][0]["args"]
        done = subprocess.run(
            [str(release.tideshift), *args],
            env=env, cwd=self.logs, capture_output=True, text=True, timeout=WAIT, check=False,
        )  # fmt: skip
        assert done.returncode == 0, f"{pod_name}: {done.stdout[-2000:]}{done.stderr[-2000:]}"

    def start(self, release: Release, deployment: dict[str, Any], pod_name: str) -> Pod:
        spec = deployment["spec"]["template"]["spec"]
        env = self.environment(pod_name, spec)
        port = free_port("127.0.0.1")
        env["TIDESHIFT_HEALTH_PORT"], env["TIDESHIFT_HEALTH_HOST"] = str(port), "127.0.0.1"
        log = self.logs / f"{pod_name}.log"
        with log.open("ab") as output:
            process = subprocess.Popen(
                [str(release.tideshift), *spec["containers"][0]["args"]],
                env=env, cwd=self.logs, stdin=subprocess.DEVNULL, stdout=output,
                stderr=subprocess.STDOUT,
            )  # fmt: skip
        pod = Pod(pod_name, process, port, log)
        self.pods.append(pod)
        return pod

    def stop_all(self) -> None:
        for pod in self.pods:
            if pod.process.poll() is None:
                pod.terminate()


def wait_for(check: Any, what: str, timeout: float = WAIT) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = check()
        if found:
            return found
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


# -- the workload and what NATS holds --------------------------------------------------------


class Forecasts:
    """A stand-in predictor for `web`: a new level every 2 s, so commands keep flowing."""

    def __init__(self, nats_url: str, namespace: str) -> None:
        self.nats_url, self.namespace = nats_url, namespace
        self.stop = threading.Event()
        self.thread = threading.Thread(target=lambda: asyncio.run(self._run()), daemon=True)

    async def _run(self) -> None:
        bus = await Bus.connect(self.nats_url, name="upgrade-forecasts")
        try:
            for rps in itertools.cycle(RATES):
                if self.stop.is_set():
                    return
                now = datetime.now(UTC)
                points = tuple(
                    events.ForecastPoint(
                        at=now + timedelta(minutes=k), point=rps, q50=rps, q90=rps, q95=rps,
                        q99=rps,
                    )
                    for k in range(10)
                )  # fmt: skip
                forecast = events.ForecastIssued(
                    workload=events.WorkloadRef(self.namespace, "Deployment.apps", "web"),
                    issued_at=now,
                    step_seconds=60,
                    model="upgrade",
                    points=points,
                )
                subject = events.FORECAST.at(namespace=self.namespace, workload="web")
                payload = readable_by_previous_release(bus._encode(subject, forecast))
                for _ in range(4):  # the level again every half second
                    await bus.connection.publish(subject.value, payload)
                    await asyncio.sleep(0.5)
        finally:
            await bus.close()


def readable_by_previous_release(encoded: bytes) -> bytes:
    """The event without its unset optional fields. 757ad34's `ForecastIssued` has no
    `coverage` nor `untrusted_reason`, and its strict readers refuse a field they do not know
    even when null: this tree's predictor sends both, so an old planner dead-letters every
    forecast of an upgraded predictor (see the check on dead letters below). The stand-in sends
    what a predictor of either release would."""
    event = json.loads(encoded)
    event["data"] = {k: v for k, v in event["data"].items() if v not in (None, "")}
    return json.dumps(event).encode()


@dataclass(frozen=True)
class Held:
    """What NATS holds: each stream's (first sequence, last sequence), each bucket's keys."""

    streams: dict[str, tuple[int, int]]
    buckets: dict[str, set[str]]


async def held(bus: Bus) -> Held:
    streams: dict[str, tuple[int, int]] = {}
    buckets: dict[str, set[str]] = {}
    for info in await bus.js.streams_info():
        name = info.config.name
        streams[name] = (info.state.first_seq, info.state.last_seq)
        if name.startswith("KV_"):
            bucket = await bus.js.key_value(name.removeprefix("KV_"))
            with contextlib.suppress(Exception):  # NoKeysError: an empty bucket
                buckets[name.removeprefix("KV_")] = set(await bucket.keys())
            buckets.setdefault(name.removeprefix("KV_"), set())
    return Held(streams, buckets)


async def commands_and_results(
    bus: Bus, namespace: str
) -> tuple[list[events.ScaleCommand], list[events.ScaleResult]]:
    commands = await read_stored(
        bus, events.SCALE_COMMAND.filter(namespace=namespace), stream=SCALE_STREAM
    )
    results = await read_stored(
        bus, events.SCALE_RESULT.filter(namespace=namespace), stream=SCALE_STREAM
    )
    return commands, results


def applied_by(results: list[events.ScaleResult], marker: str) -> int:
    return sum(1 for r in results if r.outcome == "applied" and marker in r.executor)


# -- the test ----------------------------------------------------------------------------------


@pytest.fixture
def stage(k8s_cluster: Any, k8s_namespace: str, tmp_path: Path) -> Iterator[tuple[Kubelet, str]]:
    with k8s_cluster.api_client() as api:
        kubelet = Kubelet(k8s_cluster, api, k8s_namespace, tmp_path)
        try:
            yield kubelet, k8s_namespace
        finally:
            kubelet.stop_all()


def test_helm_upgrade_from_the_previous_release_keeps_streams_and_loses_no_command(
    k8s_cluster: Any, stage: tuple[Kubelet, str], tmp_path: Path
) -> None:
    kubelet, namespace = stage
    old, new = previous_release(), current_release()
    kube_env = {"KUBECONFIG": str(k8s_cluster.kubeconfig)}
    release = f"up-{uuid.uuid4().hex[:6]}"
    with EmbeddedNats(provision=False, store_dir=tmp_path / "nats") as nats:
        values = {
            "nats": {"bundled": {"enabled": False}, "url": nats.url},
            "predictor": {
                "config": {
                    # Its own workload only: `web`'s forecasts are the test's.
                    "metric_source": "sim",
                    "workloads": [{"namespace": namespace, "name": "idle"}],
                    "max_announced_workloads": 0,
                }
            },
            "planner": {"config": {"tick_seconds": 1.0, "debounce_seconds": 0.1}},
        }
        web = {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {
                "name": "web",
                "labels": {"tideshift.io/role": "serving"},
                "annotations": SERVING,
            },
            "spec": {
                "replicas": 1,
                "selector": {"matchLabels": {"app": "web"}},
                "template": pod_template({"app": "web"}, cpu="100m"),
            },
        }
        create(KubeHttp(kubelet.api), collection("Deployment", namespace), web)
        loop = asyncio.new_event_loop()
        bus = loop.run_until_complete(Bus.connect(nats.url, name="upgrade-observer"))
        forecasts = Forecasts(nats.url, namespace)
        try:
            run_helm("install", release, str(old.chart), "-n", namespace,
                     *values_args(values, tmp_path), env=kube_env)  # fmt: skip
            pods = roll_out(kubelet, old, release, namespace, "old", previous={})
            forecasts.thread.start()

            def results() -> list[events.ScaleResult]:
                return loop.run_until_complete(commands_and_results(bus, namespace))[1]

            wait_for(
                lambda: applied_by(results(), "-old") >= COMMANDS_PER_PHASE,
                "commands applied by the previous release",
            )
            before = loop.run_until_complete(held(bus))
            run_helm("upgrade", release, str(new.chart), "-n", namespace,
                     *values_args(values, tmp_path), env=kube_env)  # fmt: skip
            roll_out(kubelet, new, release, namespace, "new", previous=pods)

            def upgraded() -> bool:
                commands, found = loop.run_until_complete(commands_and_results(bus, namespace))
                planned = sum(1 for c in commands if c.plan_id.startswith("planner-new"))
                return min(planned, applied_by(found, "-new")) >= COMMANDS_PER_PHASE

            wait_for(upgraded, "commands planned and applied by the upgraded release")
            forecasts.stop.set()
            forecasts.thread.join(WAIT)

            def settled() -> tuple[Any, Any] | None:
                commands, found = loop.run_until_complete(commands_and_results(bus, namespace))
                keys = {r.idempotency_key for r in found}
                every = all(c.idempotency_key in keys for c in commands)
                return (commands, found) if every else None

            commands, found = wait_for(settled, "a result for every command")
            after = loop.run_until_complete(held(bus))
            letters = loop.run_until_complete(
                read_stored(bus, events.DEAD_LETTER.filter(), stream=DEAD_LETTER_STREAM)
            )
        finally:
            forecasts.stop.set()
            loop.run_until_complete(bus.close())
            loop.close()
            kubelet.stop_all()
            run_helm("uninstall", release, "-n", namespace, env=kube_env, check=False)
    # An older consumer reads what a newer producer sends during the rollout: optional fields
    # added within v1 travel only once set (events/codec.py), and this workload sets none.
    refused = Counter(f"{letter.consumer}: {letter.reason[:120]}" for letter in letters)
    print(f"upgrade: dead letters during the rollout {dict(refused)}")
    assert not refused, f"an older consumer refused a newer producer's events: {dict(refused)}"
    check_kept(before, after)
    check_commands(commands, found)


def roll_out(
    kubelet: Kubelet,
    release: Release,
    helm_release: str,
    namespace: str,
    suffix: str,
    *,
    previous: dict[str, Pod],
) -> dict[str, Pod]:
    """The revision's provisioning Job if it renders one (with NATS logins; on a server
    without, as here, each service creates or updates the streams and buckets itself as it
    starts), then each Deployment's new pod ready before its old one is stopped (maxSurge 1,
    maxUnavailable 0); the new pods by component."""
    objects = installed_objects(kubelet.k8s_cluster.kubeconfig, helm_release, namespace)
    for job in (o for o in objects if o["kind"] == "Job" and component(o) == "nats-provision"):
        kubelet.job(release, job, f"nats-provision-{suffix}")
    deployments = {component(o): o for o in objects if o["kind"] == "Deployment"}
    assert set(ROLL_ORDER) <= set(deployments), sorted(deployments)
    pods: dict[str, Pod] = {}
    for name in ROLL_ORDER:
        pod = kubelet.start(release, deployments[name], f"{name}-{suffix}")
        wait_for(pod.ready, f"{pod.name} ready", START_WAIT)
        pods[name] = pod
        if name in previous:
            code = previous[name].terminate()
            assert code == 0, f"{previous[name].name} exited {code}: {previous[name].tail()}"
    return pods


def check_kept(before: Held, after: Held) -> None:
    """Every stream and bucket is still there; no stream (other than the buckets' own, which
    drop a key's older values by design) lost a message it held (its first sequence did not
    move on in a few minutes, far under any age limit), and the buckets
    whose keys only their owner removes kept them all (the snapshot follows the cluster, and
    members and leases expire by design)."""
    missing = sorted(set(before.streams) - set(after.streams))
    assert not missing, f"streams or buckets gone after the upgrade: {missing}"
    for name, (first, last) in before.streams.items():
        if name.startswith("KV_"):  # a bucket keeps a key's last value only: checked by keys
            continue
        first_after, last_after = after.streams[name]
        assert first_after <= max(first, 1) and last_after >= last, (name, first, last)
    assert before.streams[HISTORY_STREAM.name][1] > 0, "the decision history had plans"
    for bucket in (RISE_HISTORY_BUCKET, PINS_BUCKET, EXECUTOR_RECORDS_BUCKET):
        if bucket in before.buckets:
            assert before.buckets[bucket] <= after.buckets.get(bucket, set()), bucket


def check_commands(commands: list[events.ScaleCommand], results: list[events.ScaleResult]) -> None:
    answered = {result.idempotency_key for result in results}
    applied = Counter(r.idempotency_key for r in results if r.outcome == "applied")
    lost = [c.idempotency_key for c in commands if c.idempotency_key not in answered]
    doubled = {key: n for key, n in applied.items() if n > 1}
    planners = Counter(c.plan_id.rsplit("-", 1)[0] for c in commands)
    print(
        f"upgrade: {len(commands)} commands by {dict(planners)}; results "
        f"{dict(Counter(r.outcome for r in results))}; lost {len(lost)}, doubled {len(doubled)}"
    )
    assert (lost, doubled) == ([], {})
    assert any("old" in p for p in planners) and any("new" in p for p in planners), planners
