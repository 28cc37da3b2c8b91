"""What an operator sees on the real control plane, with the watcher, planner and executor
running as processes (each service as its own ServiceAccount with the chart's ClusterRole):

* act mode: the labelled Deployment the pipeline scales carries a Normal `TideshiftScaled`
  Event with old -> new and the plan's reason, and so does the training job it shrinks or
  grows; `tideshift explain` prints the Deployment's decisions with what the executor did;
  `tideshift status` shows the serving workload and the training job;
* observe mode (`--mode observe`, the chart's `executor.config.mode`): the Deployment keeps
  its replicas, carries a `TideshiftWouldScale` Event, and `tideshift explain` shows the
  `would_scale` result beside the cluster's count.

A stand-in predictor publishes the forecasts (the predictor itself needs Prometheus; its own
tests cover it). The commands' text output is printed (`pytest -s` shows it).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import subprocess
import threading
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tests.k8s.cluster_objects import (
    collection,
    create,
    end_processes,
    pipeline_kubeconfigs,
    wait_until,
)
from tests.k8s.cluster_objects import deployment as plain_deployment
from tests.k8s.test_workloads_e2e import SERVING, batch_job, publish_forecast, tideshift
from tideshift.services.cluster.adapters.http import KubeHttp
from tideshift.services.common.bus import Bus
from tideshift.services.common.embedded_nats import EmbeddedNats
from tideshift.services.devcluster.versions import default_bin_dir

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

WAIT = 90.0  # seconds for the loop to reach a state in the apiserver (2 shared cores)
RPS = 250.0  # forecast demand: 3 replicas of 100 req/s


@dataclass
class Pipeline:
    """Watcher, planner and executor against one namespace, on their own NATS."""

    namespace: str
    nats_url: str
    admin: KubeHttp
    logs: Path
    kubeconfig: Path
    processes: list[subprocess.Popen[bytes]] = field(default_factory=list)
    rps: float = RPS  # what the stand-in predictor forecasts
    stop: threading.Event = field(default_factory=threading.Event)

    def eventually(self, check: Callable[[], Any], what: str) -> Any:
        def checked() -> Any:
            dead = [p.args for p in self.processes if p.poll() is not None]
            assert not dead, f"a service exited: {dead}; logs in {self.logs}"
            return check()

        return wait_until(checked, timeout=WAIT, what=what)

    def events(self, name: str, reason: str) -> list[dict[str, Any]]:
        items = self.admin.get(f"/api/v1/namespaces/{self.namespace}/events")["items"]
        return [e for e in items if e["involvedObject"]["name"] == name and e["reason"] == reason]

    def replicas(self, name: str) -> int:
        return int(
            self.admin.get(f"{collection('Deployment', self.namespace)}/{name}")["spec"]["replicas"]
        )

    def cli(self, *argv: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            tideshift(*argv, "--nats-url", self.nats_url),
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )

    def describe(self, kind: str, name: str) -> str:
        """`kubectl describe`: where an operator looks first."""
        kubectl = [str(default_bin_dir() / "kubectl"), "--kubeconfig", str(self.kubeconfig)]
        done = subprocess.run(
            [*kubectl, "describe", kind, name, "-n", self.namespace],
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        )
        return done.stdout

    def explain(self, name: str) -> dict[str, Any] | None:
        done = self.cli("explain", f"deploy/{name}", "-n", self.namespace, "-o", "json")
        return json.loads(done.stdout) if done.returncode == 0 else None


def web() -> dict[str, Any]:
    obj = plain_deployment("web", 1, cpu="1", annotations=SERVING)
    obj["metadata"]["labels"] = {"tideshift.io/role": "serving"}
    return obj


async def forecasts(pipeline: Pipeline) -> None:
    """A stand-in predictor: every half second, RPS for the next ten minutes."""
    bus = await Bus.connect(pipeline.nats_url, name="operator-forecast")
    try:
        while not pipeline.stop.is_set():
            await publish_forecast(bus, pipeline.namespace, rps=pipeline.rps)
            await asyncio.sleep(0.5)
    finally:
        await bus.close()


@contextlib.contextmanager
def running(k8s_cluster: Any, logs: Path, *, mode: str) -> Iterator[Pipeline]:
    namespace = f"t-op-{uuid.uuid4().hex[:6]}"
    with k8s_cluster.api_client() as api_client, EmbeddedNats() as nats:
        admin = KubeHttp(api_client)
        create(admin, "/api/v1/namespaces", {"metadata": {"name": namespace}})
        kubeconfig = pipeline_kubeconfigs(admin, k8s_cluster, namespace, logs)
        pipeline = Pipeline(namespace, nats.url, admin, logs, k8s_cluster.kubeconfig)
        common = ["--nats-url", nats.url, "--health-port", "-1"]
        argvs = {
            "watcher": ("watcher", "--kubeconfig", kubeconfig["watcher"], "--namespace", namespace),
            "executor": ("executor", "--kubeconfig", kubeconfig["executor"], "--mode", mode),
            "planner": ("planner", "--tick-seconds", "0.5", "--debounce-seconds", "0.1"),
        }
        for name, argv in argvs.items():
            handle = (logs / f"{name}.log").open("ab")
            pipeline.processes.append(
                subprocess.Popen(
                    tideshift("run", *argv, *common),
                    stdin=subprocess.DEVNULL,
                    stdout=handle,
                    stderr=handle,
                )
            )
        predictor = threading.Thread(target=lambda: asyncio.run(forecasts(pipeline)), daemon=True)
        try:
            create(admin, collection("Deployment", namespace), web())
            create(admin, collection("Job.batch", namespace), batch_job("ctr"))
            predictor.start()
            yield pipeline
        finally:
            pipeline.stop.set()
            end_processes(pipeline.processes)
            admin.json("DELETE", f"/api/v1/namespaces/{namespace}")


def test_act_mode_leaves_events_and_explain_and_status_tell_the_story(
    k8s_cluster: Any, tmp_path: Path
) -> None:
    with running(k8s_cluster, tmp_path, mode="act") as pipeline:
        pipeline.eventually(lambda: pipeline.replicas("web") == 3, "web scaled to 3")
        (scaled,) = pipeline.eventually(
            lambda: pipeline.events("web", "TideshiftScaled"), "a TideshiftScaled Event on web"
        )
        assert scaled["type"] == "Normal"
        assert scaled["message"].startswith("1 -> 3: forecast q0.99 peak 250.0 req/s")
        assert scaled["source"]["component"] == "tideshift"
        (grown,) = pipeline.eventually(
            lambda: pipeline.events("ctr", "TideshiftScaled"), "a TideshiftScaled Event on ctr"
        )
        assert grown["type"] == "Normal" and " trainers (2 -> " in grown["message"]
        described = pipeline.describe("deployment", "web")
        assert "Normal  TideshiftScaled" in described and "1 -> 3: forecast q0.99" in described
        print(described[described.index("Events:") :])
        print(pipeline.describe("job", "ctr").split("Events:")[1])

        def applied() -> Any:
            told = pipeline.explain("web")
            steps = told["steps"] if told else []
            return [s for s in steps for e in s["executed"] if e["outcome"] == "applied"]

        (step, *_) = pipeline.eventually(applied, "explain to show the applied command")
        assert (step["current"], step["desired"], step["forecast_rps"]) == (1, 3, RPS)
        assert step["executed"][0]["previous"] == 1 and step["executed"][0]["current"] == 3

        def both() -> Any:
            done = pipeline.cli("status", "-o", "json")
            seen = json.loads(done.stdout) if done.returncode == 0 else {}
            serving = [r for r in seen.get("serving", []) if r["target"].endswith("/web")]
            jobs = [r for r in seen.get("jobs", []) if r["target"].endswith("/ctr")]
            return (serving, jobs, seen) if serving and jobs else None

        serving, jobs, seen = pipeline.eventually(both, "status to show web and ctr")
        assert serving[0]["replicas"] == 3 and serving[0]["forecast_rps"] == RPS
        assert jobs[0]["planned"] is not None
        assert [p["leader"] for p in seen["planners"]] == [True]
        print(pipeline.cli("explain", "deploy/web", "-n", pipeline.namespace).stdout)
        print(pipeline.cli("status").stdout)


def test_a_busy_target_keeps_one_event_whose_count_rises(k8s_cluster: Any, tmp_path: Path) -> None:
    with running(k8s_cluster, tmp_path, mode="act") as pipeline:
        for rps, replicas in ((RPS, 3), (450.0, 5), (150.0, 2), (350.0, 4)):
            pipeline.rps = rps
            pipeline.eventually(
                lambda r=replicas: pipeline.replicas("web") == r, f"web at {replicas}"
            )
        (event,) = pipeline.eventually(
            lambda: [e for e in pipeline.events("web", "TideshiftScaled") if e["count"] == 4],
            "one TideshiftScaled Event on web counting the four scales",
        )
        assert event["message"].startswith("2 -> 4: forecast q0.99 peak 350.0 req/s")
        assert len(pipeline.events("web", "TideshiftScaled")) == 1
        told = pipeline.explain("web")
        moves = [
            (e["previous"], e["current"])
            for s in (told or {}).get("steps", [])
            for e in s["executed"]
            if e["outcome"] == "applied"
        ]
        assert moves == [(1, 3), (3, 5), (5, 2), (2, 4)]
        print(pipeline.describe("deployment", "web").split("Events:")[1])


def test_observe_mode_changes_nothing_and_says_what_it_would_do(
    k8s_cluster: Any, tmp_path: Path
) -> None:
    with running(k8s_cluster, tmp_path, mode="observe") as pipeline:
        (would,) = pipeline.eventually(
            lambda: pipeline.events("web", "TideshiftWouldScale"),
            "a TideshiftWouldScale Event on web",
        )
        assert would["type"] == "Normal"
        assert would["message"].startswith("would scale 1 -> 3: forecast q0.99 peak 250.0")
        described = pipeline.describe("deployment", "web")
        assert (
            "TideshiftWouldScale" in described and "Replicas:               1 desired" in described
        )
        print(described[described.index("Replicas:") :].splitlines()[0])
        print(described[described.index("Events:") :])

        def observed() -> Any:
            told = pipeline.explain("web")
            steps = told["steps"] if told else []
            return [e for s in steps for e in s["executed"] if e["outcome"] == "would_scale"]

        (executed, *_) = pipeline.eventually(observed, "explain to show a would_scale result")
        assert (executed["previous"], executed["current"]) == (1, 3)
        # The Event and the result came after the executor read the Deployment: still at 1,
        # and nothing scaled anything in this namespace.
        assert pipeline.replicas("web") == 1
        assert pipeline.events("web", "TideshiftScaled") == []
        assert pipeline.events("ctr", "TideshiftScaled") == []

        def beside() -> Any:
            done = pipeline.cli("status", "-o", "json")
            seen = json.loads(done.stdout) if done.returncode == 0 else {}
            rows = [r for r in seen.get("serving", []) if r["target"].endswith("/web")]
            return rows if rows and rows[0]["executor"] else None

        (row,) = pipeline.eventually(beside, "status to show web's would_scale result")
        # What the cluster has (the watcher's count) beside what would have been done.
        assert (row["replicas"], row["planned"], row["executor"]) == (1, 3, "would_scale 1 -> 3")
        print(pipeline.cli("explain", "deploy/web", "-n", pipeline.namespace).stdout)
        print(pipeline.cli("status").stdout)
