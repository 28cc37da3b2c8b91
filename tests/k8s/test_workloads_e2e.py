"""The loop closed on every kind the seeds use, on the real control plane: the watcher, the
planner and the executor run as processes, the test publishes forecasts, and every assertion
reads the apiserver's objects.

A labelled, annotated serving Deployment runs next to, in turn, a Volcano Job shaped like the
seed ctr-volcano, a PyTorchJob with elasticPolicy, a batch/v1 Job and a StatefulSet. No Helm
values name any of them: the watcher announces them.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import threading
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from tests.k8s.cluster_objects import (
    collection,
    create,
    end_processes,
    pipeline_kubeconfigs,
    pod_template,
    wait_until,
)
from tideshift.events import (
    FORECAST,
    PLAN_DECIDED,
    ForecastIssued,
    ForecastPoint,
    PlanDecided,
    WorkloadRef,
)
from tideshift.services.cluster.adapters.http import KubeHttp
from tideshift.services.common.bus import Bus
from tideshift.services.common.embedded_nats import EmbeddedNats

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

WAIT = 60.0  # seconds for the loop to reach a state in the apiserver
CPU_PER_TRAINER = "3"  # 8 trainers need 24 of the cluster's 32 cpu
SERVING = {
    "tideshift.io/capacity-rps": "100",
    "tideshift.io/min-replicas": "1",
    "tideshift.io/max-replicas": "26",
    "tideshift.io/lead-time-seconds": "0",
    "tideshift.io/stabilization-seconds": "1",
}


def tideshift(*args: str) -> list[str]:
    return [sys.executable, "-m", "tideshift.services.cli", *args]


@dataclass
class Loop:
    """The services running against one namespace, and how to reach them."""

    namespace: str
    nats_url: str
    admin: KubeHttp
    logs: Path
    processes: list[subprocess.Popen[bytes]] = field(default_factory=list)
    rps: float = 50.0  # the demand the stand-in predictor forecasts, every half second
    stop: threading.Event = field(default_factory=threading.Event)

    def alive(self) -> None:
        dead = [p.args for p in self.processes if p.poll() is not None]
        assert not dead, f"a service exited: {dead}; logs in {self.logs}"

    def get(self, kind: str, name: str) -> dict[str, Any]:
        return self.admin.get(f"{collection(kind, self.namespace)}/{name}")

    def delete(self, kind: str, name: str) -> None:
        """Delete with its pods (a batch/v1 Job would orphan them by default)."""
        path = f"{collection(kind, self.namespace)}/{name}"
        self.admin.json("DELETE", path, body={"propagationPolicy": "Background"})

    def eventually(self, check: Callable[[], Any], what: str) -> Any:
        def checked() -> Any:
            self.alive()
            return check()

        return wait_until(checked, timeout=WAIT, what=what)


@pytest.fixture(scope="module")
def loop(k8s_cluster: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Loop]:
    namespace = f"t-e2e-{uuid.uuid4().hex[:6]}"
    logs = tmp_path_factory.mktemp("e2e-logs")
    with k8s_cluster.api_client() as api_client, EmbeddedNats() as nats:
        admin = KubeHttp(api_client)
        create(admin, "/api/v1/namespaces", {"metadata": {"name": namespace}})
        kubeconfig = pipeline_kubeconfigs(admin, k8s_cluster, namespace, logs)
        state = Loop(namespace, nats.url, admin, logs)
        common = ["--nats-url", nats.url, "--health-port", "-1"]
        argvs = {
            "watcher": tideshift(
                "run",
                "watcher",
                *common,
                "--kubeconfig",
                kubeconfig["watcher"],
                "--namespace",
                namespace,
            ),
            "executor": tideshift(
                "run", "executor", *common, "--kubeconfig", kubeconfig["executor"]
            ),
            "planner": tideshift(
                "run",
                "planner",
                *common,
                "--tick-seconds",
                "0.5",
                "--debounce-seconds",
                "0.1",
                "--min-trainer-lifetime-s",
                "0",
            ),
        }
        for name, argv in argvs.items():
            handle = (logs / f"{name}.log").open("ab")
            state.processes.append(
                subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=handle, stderr=handle)
            )
        try:
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
                    "template": pod_template({"app": "web"}, cpu="1"),
                },
            }
            create(admin, collection("Deployment", namespace), web)
            predictor = threading.Thread(target=lambda: asyncio.run(forecasts(state)), daemon=True)
            predictor.start()
            yield state
        finally:
            state.stop.set()
            end_processes(state.processes)
            admin.json("DELETE", f"/api/v1/namespaces/{namespace}")


async def forecasts(loop: Loop) -> None:
    """A stand-in predictor: every half second, `loop.rps` for the next ten minutes."""
    bus = await Bus.connect(loop.nats_url, name="e2e-forecast")
    try:
        while not loop.stop.is_set():
            await publish_forecast(bus, loop.namespace, rps=loop.rps)
            await asyncio.sleep(0.5)
    finally:
        await bus.close()


async def publish_forecast(bus: Bus, namespace: str, *, rps: float) -> None:
    now = datetime.now(UTC)
    points = tuple(
        ForecastPoint(at=now + timedelta(minutes=k), point=rps, q50=rps, q90=rps, q95=rps, q99=rps)
        for k in range(10)
    )
    forecast = ForecastIssued(
        workload=WorkloadRef(namespace, "Deployment.apps", "web"),
        issued_at=now,
        step_seconds=60,
        model="e2e",
        points=points,
    )
    await bus.publish(FORECAST.at(namespace=namespace, workload="web"), forecast)


def trainer_template(name: str) -> dict[str, Any]:
    return pod_template({"app": name}, cpu=CPU_PER_TRAINER)


def volcano_job(name: str) -> dict[str, Any]:
    """Shaped like seed ctr-volcano: 2 pservers and trainers; minAvailable = 2 + 2 trainers."""
    pserver = pod_template({"app": name, "tideshift.io/companion": "true"}, cpu="1")
    return {
        "apiVersion": "batch.volcano.sh/v1alpha1",
        "kind": "Job",
        "metadata": {
            "name": name,
            "labels": {"tideshift.io/role": "training"},
            "annotations": {"tideshift.io/scale-task": "trainer", "tideshift.io/max-replicas": "8"},
        },
        "spec": {
            "minAvailable": 4,
            "schedulerName": "volcano",
            "tasks": [
                {"name": "pserver", "replicas": 2, "template": pserver},
                {"name": "trainer", "replicas": 2, "template": trainer_template(name)},
            ],
        },
    }


def pytorch_job(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "kubeflow.org/v1",
        "kind": "PyTorchJob",
        "metadata": {"name": name, "labels": {"tideshift.io/role": "training"}},
        "spec": {
            "elasticPolicy": {"minReplicas": 2, "maxReplicas": 8, "rdzvBackend": "c10d"},
            "pytorchReplicaSpecs": {
                "Worker": {"replicas": 2, "template": trainer_template(name)},
            },
        },
    }


def batch_job(name: str) -> dict[str, Any]:
    template = trainer_template(name)
    template["spec"]["restartPolicy"] = "Never"
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": name,
            "labels": {"tideshift.io/role": "training"},
            "annotations": {"tideshift.io/min-replicas": "2", "tideshift.io/max-replicas": "8"},
        },
        "spec": {"parallelism": 2, "template": template},
    }


def statefulset(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": {
            "name": name,
            "labels": {"tideshift.io/role": "training"},
            "annotations": {"tideshift.io/min-replicas": "2", "tideshift.io/max-replicas": "8"},
        },
        "spec": {
            "replicas": 2,
            "serviceName": name,
            "selector": {"matchLabels": {"app": name}},
            "template": trainer_template(name),
        },
    }


def trainers(kind: str, obj: dict[str, Any]) -> int:
    spec = obj["spec"]
    if kind == "Job.batch.volcano.sh":
        return next(t["replicas"] for t in spec["tasks"] if t["name"] == "trainer")
    if kind == "PyTorchJob.kubeflow.org":
        return int(spec["pytorchReplicaSpecs"]["Worker"]["replicas"])
    if kind == "Job.batch":
        return int(spec["parallelism"])
    return int(spec["replicas"])


def gang_valid(kind: str, obj: dict[str, Any]) -> bool:
    """Volcano: the job's minAvailable never exceeds the pods its tasks ask for."""
    if kind != "Job.batch.volcano.sh":
        return True
    return obj["spec"]["minAvailable"] <= sum(t["replicas"] for t in obj["spec"]["tasks"])


KINDS = {
    "volcano": ("Job.batch.volcano.sh", volcano_job),
    "pytorch": ("PyTorchJob.kubeflow.org", pytorch_job),
    "batch": ("Job.batch", batch_job),
    "statefulset": ("StatefulSet.apps", statefulset),
}


async def last_plan_lists(nats_url: str, name: str, *, plans: int = 2) -> list[bool]:
    """Whether each of the next `plans` plans names `name` among its targets."""
    bus = await Bus.connect(nats_url, name="e2e-plans")
    seen: list[bool] = []
    try:
        async with asyncio.timeout(WAIT):
            async for envelope in bus.subscribe(PLAN_DECIDED.filter(), consumer="e2e"):
                plan = envelope.data
                assert isinstance(plan, PlanDecided)
                seen.append(any(t.target.name == name for t in plan.targets))
                if len(seen) == plans:
                    break
    finally:
        await bus.close()
    return seen


@pytest.mark.parametrize("case", list(KINDS))
def test_training_gives_way_to_serving_and_grows_back_then_is_forgotten(
    loop: Loop, case: str
) -> None:
    kind, manifest = KINDS[case]
    name = f"train-{case}"
    create(loop.admin, collection(kind, loop.namespace), manifest(name))

    # Low demand: the job grows to its maximum (what fits: 8 x 3 cpu beside one web pod).
    loop.eventually(lambda: trainers(kind, loop.get(kind, name)) == 8, f"{name} grown to 8")

    # High demand: serving grows at once (26 cpu); training shrinks to the 6 cpu left, which
    # is its gang minimum of 2 trainers, and never below it.
    loop.rps = 3000.0
    loop.eventually(lambda: loop.get("Deployment", "web")["spec"]["replicas"] == 26, "web at 26")
    loop.eventually(lambda: trainers(kind, loop.get(kind, name)) == 2, f"{name} at its minimum")
    assert gang_valid(kind, loop.get(kind, name))

    # Low again: serving comes down after its (short) stabilisation, training grows back.
    loop.rps = 50.0
    loop.eventually(lambda: loop.get("Deployment", "web")["spec"]["replicas"] == 1, "web at 1")
    loop.eventually(lambda: trainers(kind, loop.get(kind, name)) == 8, f"{name} back at 8")

    # Deleted: the planner forgets it.
    loop.delete(kind, name)
    loop.eventually(
        lambda: asyncio.run(last_plan_lists(loop.nats_url, name)) == [False, False],
        f"{name} gone from the plans",
    )


def test_an_operator_pin_holds_three_cycles_and_is_released(loop: Loop) -> None:
    kind, name = "Job.batch.volcano.sh", "pinned"
    create(loop.admin, collection(kind, loop.namespace), volcano_job(name))
    loop.eventually(lambda: trainers(kind, loop.get(kind, name)) == 8, f"{name} grown to 8")

    def scale(*args: str) -> None:
        done = subprocess.run(
            tideshift(
                "scale", f"vcjob/{name}", "-n", loop.namespace, "--nats-url", loop.nats_url, *args
            ),
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 0, done.stderr

    scale("--replicas", "3", "--for", "10m")
    loop.eventually(lambda: trainers(kind, loop.get(kind, name)) == 3, "the pin applied")
    reasons = asyncio.run(pinned_reasons(loop.nats_url, name, plans=3))
    assert all("pinned at 3 by the operator" in r for r in reasons), reasons
    assert trainers(kind, loop.get(kind, name)) == 3  # three planning cycles later

    scale("--release")
    loop.eventually(lambda: trainers(kind, loop.get(kind, name)) == 8, "back under the planner")
    loop.delete(kind, name)


async def pinned_reasons(nats_url: str, name: str, *, plans: int) -> list[str]:
    bus = await Bus.connect(nats_url, name="e2e-pins")
    reasons: list[str] = []
    try:
        async with asyncio.timeout(WAIT):
            async for envelope in bus.subscribe(PLAN_DECIDED.filter(), consumer="e2e-pins"):
                found = [t.reason for t in envelope.data.targets if t.target.name == name]
                # The pin reaches the planner through a KV watch: plans decided before it
                # arrived do not count; from the first plan that reports it, every one must.
                if reasons or any("pinned at" in r for r in found):
                    reasons += found
                if len(reasons) >= plans:
                    break
    finally:
        await bus.close()
    return reasons


def test_an_unreadable_annotation_is_reported_on_the_object_and_skipped(loop: Loop) -> None:
    name = "typo"
    job = batch_job(name)
    job["metadata"]["annotations"]["tideshift.io/max-replicas"] = "eight"
    create(loop.admin, collection("Job.batch", loop.namespace), job)

    def warning() -> dict[str, Any] | None:
        events = loop.admin.get(
            f"/api/v1/namespaces/{loop.namespace}/events",
            query=[("fieldSelector", f"involvedObject.name={name}")],
        )
        found = [e for e in events.get("items") or [] if e["reason"] == "TideshiftInvalidPolicy"]
        return found[0] if found else None

    event = loop.eventually(warning, "a TideshiftInvalidPolicy event")
    assert "tideshift.io/max-replicas='eight'" in event["message"]
    assert event["involvedObject"]["kind"] == "Job" and event["type"] == "Warning"
    assert asyncio.run(last_plan_lists(loop.nats_url, name)) == [False, False]  # skipped
    assert loop.get("Job.batch", name)["spec"]["parallelism"] == 2  # left as it was
    loop.delete("Job.batch", name)
