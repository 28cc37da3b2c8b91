"""Chaos scenario 3: the kube-apiserver SIGKILLed and restarted while the watcher watches and
the executor writes. After each recovery the watcher's KV snapshot equals a fresh list of the
pods (none missed, none left behind), and every scale command has its result.

It restarts the apiserver of the session's shared control plane and returns only once it is
ready again, so later tests find it as before. Real processes, the real nats-server.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from tests.chaos.objects import create_web_deployment
from tests.chaos.report import ChaosReport
from tests.chaos.stored import read_stored
from tests.k8s.cluster_objects import end_processes
from tideshift import events
from tideshift.events import SNAPSHOT_BUCKET
from tideshift.services.cluster.adapters.http import KubeHttp
from tideshift.services.common.bus import SCALE_STREAM, Bus
from tideshift.services.common.embedded_nats import EmbeddedNats

pytestmark = pytest.mark.slow

RESTARTS = 2
COMMANDS_PER_RESTART = 4
WAIT = 90.0
TIDESHIFT = str(Path(sys.executable).parent / "tideshift")


def wait_for(check: Callable[[], Any], what: str, timeout: float = WAIT) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            result = check()
        except OSError:  # the apiserver is still coming back
            result = None
        if result:
            return result
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.fixture
def services(k8s_cluster: Any, tmp_path: Path) -> Iterator[tuple[EmbeddedNats, str]]:
    namespace = f"t-apichaos-{uuid.uuid4().hex[:6]}"
    kube = ["--kubeconfig", str(k8s_cluster.kubeconfig)]
    with EmbeddedNats(store_dir=tmp_path / "nats") as nats:
        with k8s_cluster.api_client() as api_client:
            KubeHttp(api_client).json(
                "POST", "/api/v1/namespaces", body={"metadata": {"name": namespace}}
            )
        processes = []
        for name, extra in (
            ("watcher", [*kube, "--namespace", namespace, "--resync-seconds", "3600"]),
            # admission (managed-only) has its own tests; these scale an unlabelled Deployment `web`
            ("executor", [*kube, "--no-managed-only"]),
        ):
            with (tmp_path / f"{name}.log").open("ab") as log:
                processes.append(
                    subprocess.Popen(
                        [
                            TIDESHIFT,
                            "run",
                            name,
                            "--nats-url",
                            nats.url,
                            "--health-port",
                            "-1",
                            *extra,
                        ],
                        stdin=subprocess.DEVNULL,
                        stdout=log,
                        stderr=subprocess.STDOUT,
                    )
                )
        try:
            yield nats, namespace
        finally:
            end_processes(processes)


async def _snapshot_pods(bus: Bus, namespace: str) -> dict[str, tuple[str, str | None]]:
    """The watcher's KV snapshot of the namespace's pods: name -> (phase, node)."""
    kv = await bus.kv(SNAPSHOT_BUCKET)
    pods = {}
    async for _, pod in kv.items(events.PodChanged):
        if pod.namespace == namespace and not pod.deleting:
            pods[pod.name] = (pod.phase, pod.node)
    return pods


def _listed_pods(admin: KubeHttp, namespace: str) -> dict[str, tuple[str, str | None]]:
    items = admin.get(f"/api/v1/namespaces/{namespace}/pods")["items"]
    return {
        item["metadata"]["name"]: (
            item["status"].get("phase", "Unknown"),
            item["spec"].get("nodeName"),
        )
        for item in items
        if not item["metadata"].get("deletionTimestamp")
    }


def _converged(
    admin: KubeHttp, loop: asyncio.AbstractEventLoop, bus: Bus, namespace: str, replicas: int
) -> bool:
    listed = _listed_pods(admin, namespace)
    snapshot = loop.run_until_complete(_snapshot_pods(bus, namespace))
    return len(listed) == replicas and listed == snapshot


def test_apiserver_restarts_leave_snapshot_equal_to_a_fresh_list(
    k8s_cluster: Any, services: tuple[EmbeddedNats, str]
) -> None:
    nats, namespace = services
    report = ChaosReport("3. kube-apiserver SIGKILLed and restarted under watch and writes")
    target = events.WorkloadRef(kind="Deployment", namespace=namespace, name="web")
    subject = events.SCALE_COMMAND.at(namespace=namespace, kind=target.kind, name=target.name)
    path = f"/apis/apps/v1/namespaces/{namespace}/deployments/web"
    loop = asyncio.new_event_loop()
    bus = loop.run_until_complete(Bus.connect(nats.url, name="chaos-api"))
    loop.run_until_complete(bus.ensure_streams())
    keys: list[str] = []
    issued = datetime.now(UTC)
    try:
        with k8s_cluster.api_client() as api_client:
            admin = KubeHttp(api_client)
            create_web_deployment(admin, namespace, replicas=1)
            desired = 1
            for restart in range(RESTARTS):
                # The apiserver dies between two commands, possibly mid-write; the executor
                # retries what failed and the watcher lists and watches again.
                for step in range(COMMANDS_PER_RESTART):
                    desired = 2 + (restart * COMMANDS_PER_RESTART + step) % 5
                    key = f"apichaos-{namespace}-{len(keys)}"
                    keys.append(key)
                    command = events.ScaleCommand(
                        target=target,
                        desired=desired,
                        reason="chaos",
                        plan_id=f"plan-{len(keys)}",
                        issued_at=issued + timedelta(seconds=len(keys)),
                        idempotency_key=key,
                    )
                    loop.run_until_complete(bus.publish_durable(subject, command, msg_id=key))
                    if step == 1:
                        k8s_cluster.local.restart("kube-apiserver")
                        report.faults += 1
                        back_at = time.monotonic()
                report.runs += 1
                wait_for(lambda d=desired: admin.get(path)["spec"]["replicas"] == d, "last scale")
                wait_for(
                    lambda d=desired: _converged(admin, loop, bus, namespace, d),
                    "the snapshot to equal a fresh list",
                )
                report.recovery_s.append(time.monotonic() - back_at)
            listed = _listed_pods(admin, namespace)
            snapshot = loop.run_until_complete(_snapshot_pods(bus, namespace))
            report.checked = len(listed) + len(keys)  # pods, and commands with a result
            report.lost = len(set(listed) - set(snapshot))
            report.doubled = len(set(snapshot) - set(listed))
            results = {
                result.idempotency_key
                for result in loop.run_until_complete(
                    read_stored(
                        bus, events.SCALE_RESULT.filter(namespace=namespace), stream=SCALE_STREAM
                    )
                )
            }
    finally:
        loop.run_until_complete(bus.close())
        loop.close()
    report.lost += sum(1 for key in keys if key not in results)
    report.print()
    assert (report.lost, report.doubled) == (0, 0)
