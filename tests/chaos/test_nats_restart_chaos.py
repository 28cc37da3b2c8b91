"""Chaos scenario 2: the nats-server SIGKILLed and restarted on the same JetStream file store
while commands flow. No scale command or result is lost; the executor, the planner and the
watcher reconnect by themselves and are ready again.

Real processes against the real control plane; the test publishes commands through its own
reconnecting client, as the planner would, and retries a publish the dead server never
acknowledged (a publish without an ack was not sent).
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import nats.errors
import pytest

from tests.chaos.objects import create_web_deployment
from tests.chaos.report import ChaosReport
from tests.chaos.stored import read_stored
from tideshift import events
from tideshift.services.cluster.adapters.http import KubeHttp
from tideshift.services.common.bus import SCALE_STREAM, Bus
from tideshift.services.common.embedded_nats import EmbeddedNats
from tideshift.services.common.ports import free_port

pytestmark = pytest.mark.slow

COMMANDS = 8
KILL_BEFORE = (2, 5)  # the server dies before these commands are published
WAIT = 60.0
ACK_WAIT_SECONDS = 3.0
TIDESHIFT = str(Path(sys.executable).parent / "tideshift")


@dataclass
class Running:
    name: str
    process: subprocess.Popen[bytes]
    health_port: int
    log: Path

    def ready(self) -> bool:
        assert self.process.poll() is None, f"{self.name} exited: {self.log.read_text()[-2000:]}"
        url = f"http://127.0.0.1:{self.health_port}/readyz"
        try:
            with urllib.request.urlopen(url, timeout=2) as answer:
                return answer.status == 200
        except (urllib.error.URLError, OSError):
            return False


@dataclass
class Stage:
    nats: EmbeddedNats
    admin: KubeHttp
    namespace: str
    services: list[Running] = field(default_factory=list)


def wait_for(check: Callable[[], Any], what: str) -> Any:
    deadline = time.monotonic() + WAIT
    while time.monotonic() < deadline:
        result = check()
        if result:
            return result
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.fixture
def stage(k8s_cluster: Any, tmp_path: Path) -> Iterator[Stage]:
    namespace = f"t-natschaos-{uuid.uuid4().hex[:6]}"
    kube = ["--kubeconfig", str(k8s_cluster.kubeconfig)]
    with (
        k8s_cluster.api_client() as api_client,
        EmbeddedNats(store_dir=tmp_path / "nats") as server,
    ):
        admin = KubeHttp(api_client)
        admin.json("POST", "/api/v1/namespaces", body={"metadata": {"name": namespace}})
        state = Stage(server, admin, namespace)
        extras = {
            # A result the dead server never took is published when the command comes back
            # after the ack wait: short here so the test does not wait 30 s for it.
            "executor": [*kube, "--ack-wait-seconds", str(ACK_WAIT_SECONDS)],
            "planner": [],
            "watcher": [*kube, "--namespace", namespace],
        }
        try:
            for name, extra in extras.items():
                port = free_port("127.0.0.1")
                log = tmp_path / f"{name}.log"
                with log.open("ab") as handle:
                    argv = [TIDESHIFT, "run", name, "--nats-url", server.url, *extra]
                    argv += ["--health-host", "127.0.0.1", "--health-port", str(port)]
                    process = subprocess.Popen(
                        argv, stdin=subprocess.DEVNULL, stdout=handle, stderr=subprocess.STDOUT
                    )
                state.services.append(Running(name, process, port, log))
            for service in state.services:
                wait_for(service.ready, f"{service.name} ready")
            yield state
        finally:
            for service in state.services:
                service.process.terminate()
            for service in state.services:
                try:
                    service.process.wait(15)
                except subprocess.TimeoutExpired:
                    service.process.kill()
                    service.process.wait()


async def _publish_until_acked(bus: Bus, command: events.ScaleCommand) -> None:
    subject = events.SCALE_COMMAND.at(
        namespace=command.target.namespace, kind=command.target.kind, name=command.target.name
    )
    deadline = time.monotonic() + WAIT
    while True:
        try:
            await bus.publish_durable(subject, command, msg_id=command.idempotency_key)
            return
        except (nats.errors.Error, TimeoutError):
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.2)


def test_nats_killed_and_restarted_on_its_store_loses_nothing(stage: Stage) -> None:
    path = create_web_deployment(stage.admin, stage.namespace, replicas=0, schedulable=False)
    target = events.WorkloadRef(kind="Deployment", namespace=stage.namespace, name="web")
    report = ChaosReport("2. nats-server SIGKILLed and restarted on its file store")
    loop = asyncio.new_event_loop()
    bus = loop.run_until_complete(Bus.connect(stage.nats.url, name="chaos-publisher"))
    issued = datetime.now(UTC)
    keys = []
    try:
        for index in range(COMMANDS):
            if index in KILL_BEFORE:
                stage.nats.kill()
                report.runs += 1
                report.faults += 1
                killed_at = time.monotonic()
                stage.nats.start()
                for service in stage.services:
                    wait_for(service.ready, f"{service.name} ready after the restart")
            key = f"natschaos-{stage.namespace}-{index}"
            keys.append(key)
            command = events.ScaleCommand(
                target=target,
                desired=index + 1,
                reason="chaos",
                plan_id=f"plan-{index}",
                issued_at=issued + timedelta(seconds=index),
                idempotency_key=key,
            )
            loop.run_until_complete(_publish_until_acked(bus, command))
            wait_for(
                lambda d=index + 1: stage.admin.get(path)["spec"]["replicas"] == d,
                f"command {index} applied",
            )
            if index in KILL_BEFORE:
                report.recovery_s.append(time.monotonic() - killed_at)
        results_subject = events.SCALE_RESULT.filter(namespace=stage.namespace)

        def results() -> list[events.ScaleResult]:
            return loop.run_until_complete(read_stored(bus, results_subject, stream=SCALE_STREAM))

        wait_for(
            lambda: {result.idempotency_key for result in results()} >= set(keys),
            "a result for every command",
        )
        stored_results = results()
    finally:
        loop.run_until_complete(bus.close())
        loop.close()
    # Lost: a command with no result at all. Doubled: applied more than once (a redelivered
    # command that found its own work done reports `noop`, which is right).
    answered = {result.idempotency_key for result in stored_results}
    applied = [result.idempotency_key for result in stored_results if result.outcome == "applied"]
    report.checked = len(keys)
    report.lost = sum(1 for key in keys if key not in answered)
    report.doubled = len(applied) - len(set(applied))
    report.print()
    assert (report.lost, report.doubled) == (0, 0)
    by_key = {result.idempotency_key: result for result in stored_results}
    assert all(by_key[key].current == index + 1 for index, key in enumerate(keys))
    assert stage.admin.get(path)["spec"]["replicas"] == COMMANDS
    assert all(service.ready() for service in stage.services)
