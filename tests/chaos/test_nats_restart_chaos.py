"""Chaos scenario 2: the nats-server SIGKILLed and restarted on the same JetStream file store
while scale commands flow and a training job runs. No scale command, result or shard task is
lost: every command has its result and every (epoch, shard) of the job is applied exactly
once; the executor, the planner, the watcher, the coordinator and the pserver reconnect by
themselves and are ready again, and the trainers carry on.

Real processes against the real control plane; the test publishes commands through its own
reconnecting client, as the planner would, and retries a publish the dead server never
acknowledged (a publish without an ack was not sent). The server dies when the job has
applied a quarter and then half of its batches, never after it finished.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
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
from tests.chaos.verify import assert_nothing_lost_or_doubled
from tests.fixtures.support import answers_ready
from tests.k8s.cluster_objects import end_processes
from tideshift import events
from tideshift.services.cluster.adapters.http import KubeHttp
from tideshift.services.common.bus import SCALE_STREAM, Bus
from tideshift.services.common.embedded_nats import EmbeddedNats
from tideshift.services.common.ports import free_port
from tideshift.services.trainer.core.model import DatasetSpec, dataset_uris

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "integration" / "trainer"))

from trainer_harness import applied_total, client_of

pytestmark = pytest.mark.slow

COMMANDS = 8
KILL_BEFORE = (2, 5)  # the server dies before these commands are published
EPOCHS = 2
TRAINERS = 2
DATA = DatasetSpec(seed=5, num_shards=8, samples_per_shard=400, holdout_samples=100, batch_size=100)
BATCHES = 4  # per shard
TOTAL_BATCHES = EPOCHS * DATA.num_shards * BATCHES
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
        return answers_ready(self.health_port)

    def ready_or_done(self) -> bool:
        """Ready, or exited 0 (the coordinator, once its job is finished)."""
        return self.process.poll() == 0 or self.ready()


@dataclass
class Stage:
    nats: EmbeddedNats
    admin: KubeHttp
    namespace: str
    services: list[Running] = field(default_factory=list)
    training: list[Running] = field(default_factory=list)  # coordinator and pserver
    trainers: list[subprocess.Popen[bytes]] = field(default_factory=list)

    @property
    def job(self) -> str:
        return self.namespace

    def every_process(self) -> list[subprocess.Popen[bytes]]:
        return [r.process for r in (*self.services, *self.training)] + self.trainers


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
            "executor": [*kube, "--ack-wait-seconds", str(ACK_WAIT_SECONDS), "--no-managed-only"],
            "planner": [],
            "watcher": [*kube, "--namespace", namespace],
        }
        job = ["--job", namespace]
        training = {
            # A task whose ack the dead server never took comes back after this wait.
            "coordinator": [
                *job, "--dataset", json.dumps(dataset_uris(DATA)), "--epochs", str(EPOCHS),
                "--tick-seconds", "0.2", "--ack-wait-seconds", str(ACK_WAIT_SECONDS),
            ],
            "pserver": [*job, "--index", "0"],
        }  # fmt: skip
        try:
            for name, extra in [*extras.items(), *training.items()]:
                port = free_port("127.0.0.1")
                log = tmp_path / f"{name}.log"
                with log.open("ab") as handle:
                    argv = [TIDESHIFT, "run", name, "--nats-url", server.url, *extra]
                    argv += ["--health-host", "127.0.0.1", "--health-port", str(port)]
                    process = subprocess.Popen(
                        argv, stdin=subprocess.DEVNULL, stdout=handle, stderr=subprocess.STDOUT
                    )
                running = Running(name, process, port, log)
                (state.training if name in training else state.services).append(running)
            for index in range(TRAINERS):
                # Each shard held 2 s at least: the job (16 s and more) outlasts both restarts.
                argv = [TIDESHIFT, "run", "trainer", "--nats-url", server.url, *job]
                argv += ["--instance", f"t{index}", "--min-task-seconds", "2"]
                with (tmp_path / f"trainer-{index}.log").open("ab") as handle:
                    state.trainers.append(
                        subprocess.Popen(
                            argv, stdin=subprocess.DEVNULL, stdout=handle, stderr=subprocess.STDOUT
                        )
                    )
            for service in [*state.services, *state.training]:
                wait_for(service.ready, f"{service.name} ready")
            yield state
        finally:
            end_processes(state.every_process())


async def _publish_until_acked(bus: Bus, command: events.ScaleCommand) -> None:
    subject = events.SCALE_COMMAND.at(
        namespace=command.target.namespace, kind=command.target.kind, name=command.target.name
    )
    payload = events.encode(command, source="chaos")
    headers = {"Nats-Msg-Id": command.idempotency_key}  # a retried publish is stored once
    deadline = time.monotonic() + WAIT
    while True:
        try:
            # A short ack wait: a publish lost across the restart is retried in a second,
            # so the recovery measured is the services', not this client's.
            await bus.js.publish(subject.value, payload, headers=headers, timeout=1.0)
            return
        except (nats.errors.Error, TimeoutError):
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.1)


def fault_point_reached(applied_batches: Callable[[], int], index: int) -> int:
    """Before command `index` of KILL_BEFORE, wait until its quarter of the job's batches is
    applied (the fault lands mid-job, never after it): which quarter, 1 or 2."""
    share = KILL_BEFORE.index(index) + 1
    wait_for(
        lambda: applied_batches() >= TOTAL_BATCHES * share // 4,
        f"{share}/4 of the job's batches applied",
    )
    assert applied_batches() < TOTAL_BATCHES, "the job finished before the fault"
    return share


def numbered_command(
    target: events.WorkloadRef, index: int, key: str, issued: datetime
) -> events.ScaleCommand:
    """Command `index` of a run: `index + 1` replicas, issued a second after the one before."""
    return events.ScaleCommand(
        target=target,
        desired=index + 1,
        reason="chaos",
        plan_id=f"plan-{index}",
        issued_at=issued + timedelta(seconds=index),
        idempotency_key=key,
    )


def publish_and_wait_applied(
    loop: asyncio.AbstractEventLoop,
    bus: Bus,
    admin: KubeHttp,
    path: str,
    command: events.ScaleCommand,
) -> None:
    """Publish `command` until a server acknowledges it, then wait until the Deployment at
    `path` has the replicas it asks for."""
    loop.run_until_complete(_publish_until_acked(bus, command))
    wait_for(
        lambda: admin.get(path)["spec"]["replicas"] == command.desired,
        f"{command.plan_id} applied",
    )


def test_nats_killed_and_restarted_on_its_store_loses_nothing(stage: Stage) -> None:
    path = create_web_deployment(stage.admin, stage.namespace, replicas=0, schedulable=False)
    target = events.WorkloadRef(kind="Deployment", namespace=stage.namespace, name="web")
    report = ChaosReport("2. nats-server SIGKILLed and restarted on its file store")
    loop = asyncio.new_event_loop()
    bus = loop.run_until_complete(Bus.connect(stage.nats.url, name="chaos-publisher"))
    client = loop.run_until_complete(client_of(bus, stage.job))

    def applied_batches() -> int:
        return loop.run_until_complete(applied_total(client)) or 0

    issued = datetime.now(UTC)
    keys = []
    try:
        for index in range(COMMANDS):
            if index in KILL_BEFORE:
                fault_point_reached(applied_batches, index)
                stage.nats.kill()
                report.runs += 1
                report.faults += 1
                killed_at = time.monotonic()
                stage.nats.start()
                for service in stage.services:
                    wait_for(service.ready, f"{service.name} ready after the restart")
                for service in stage.training:
                    wait_for(service.ready_or_done, f"{service.name} ready after the restart")
            key = f"natschaos-{stage.namespace}-{index}"
            keys.append(key)
            command = numbered_command(target, index, key, issued)
            publish_and_wait_applied(loop, bus, stage.admin, path, command)
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
        coordinator = next(r for r in stage.training if r.name == "coordinator")
        wait_for(lambda: coordinator.process.poll() is not None, "the training job to finish")
        assert coordinator.process.returncode == 0, coordinator.log.read_text()[-2000:]
        statuses = loop.run_until_complete(client.status(from_epoch=0))
    finally:
        loop.run_until_complete(bus.close())
        loop.close()
    pairs = {(epoch, shard) for epoch in range(EPOCHS) for shard in range(DATA.num_shards)}
    assert_nothing_lost_or_doubled(
        report, keys, stored_results, statuses, pairs=pairs, total_batches=TOTAL_BATCHES
    )
    by_key = {result.idempotency_key: result for result in stored_results}
    assert all(by_key[key].current == index + 1 for index, key in enumerate(keys))
    assert stage.admin.get(path)["spec"]["replicas"] == COMMANDS
    assert all(service.ready() for service in stage.services)
    assert all(trainer.wait(15) == 0 for trainer in stage.trainers), "trainers leave when done"
