"""Chaos scenario: a three-server NATS cluster loses the leader of the scale-command stream,
then (that server back) the leader of the training shard-task stream, each SIGKILLed while
scale commands flow and a training job runs (issue 29). Every stream is kept on all three
servers (`--nats-replicas 3`) and every process is given the three URLs: no command, result
or shard task is lost or applied twice, and the time from each kill to the next command
applied is printed and bounded.

Real processes (nats-server, executor, planner, watcher, coordinator, pserver, trainers)
against the real control plane, with the helpers of the single-server scenario
(`test_nats_restart_chaos`): the test publishes commands as the planner would and retries a
publish no server acknowledged, with the same message id.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import nats.errors
import pytest

from tests.chaos.objects import create_web_deployment
from tests.chaos.report import ChaosReport
from tests.chaos.stored import read_stored
from tests.chaos.test_nats_restart_chaos import (
    ACK_WAIT_SECONDS,
    COMMANDS,
    DATA,
    EPOCHS,
    KILL_BEFORE,
    TIDESHIFT,
    TOTAL_BATCHES,
    TRAINERS,
    Running,
    applied_total,
    client_of,
    fault_point_reached,
    numbered_command,
    publish_and_wait_applied,
    wait_for,
)
from tests.chaos.verify import assert_nothing_lost_or_doubled
from tests.k8s.cluster_objects import end_processes
from tideshift import events
from tideshift.services.cluster.adapters.http import KubeHttp
from tideshift.services.common.bus import SCALE_STREAM, TRAINING_TASK_STREAM, Bus
from tideshift.services.common.embedded_nats import EmbeddedNats, NatsCluster
from tideshift.services.common.ports import free_port
from tideshift.services.trainer.core.model import dataset_uris

pytestmark = pytest.mark.slow

# Killed before the commands of KILL_BEFORE: the scale stream's leader, then the task stream's.
VICTIMS = (SCALE_STREAM.name, TRAINING_TASK_STREAM.name)
# A new stream leader is elected within seconds and the services reconnect within a second
# or two; the bound leaves room for a loaded machine.
RECOVERY_BOUND_SECONDS = 30.0


@dataclass
class ClusterStage:
    cluster: NatsCluster
    admin: KubeHttp
    namespace: str
    services: list[Running] = field(default_factory=list)
    training: list[Running] = field(default_factory=list)  # coordinator and pserver
    trainers: list[subprocess.Popen[bytes]] = field(default_factory=list)

    def every_process(self) -> list[subprocess.Popen[bytes]]:
        return [r.process for r in (*self.services, *self.training)] + self.trainers

    def launch(self, name: str, extra: list[str], log: Path) -> subprocess.Popen[bytes]:
        argv = [TIDESHIFT, "run", name, "--nats-url", self.cluster.url, "--nats-replicas", "3"]
        with log.open("ab") as handle:
            return subprocess.Popen(
                [*argv, *extra], stdin=subprocess.DEVNULL, stdout=handle, stderr=subprocess.STDOUT
            )


@pytest.fixture
def stage(k8s_cluster: Any, tmp_path: Path) -> Iterator[ClusterStage]:
    namespace = f"t-natscluster-{uuid.uuid4().hex[:6]}"
    kube = ["--kubeconfig", str(k8s_cluster.kubeconfig)]
    with k8s_cluster.api_client() as api_client, NatsCluster(size=3, replicas=3) as cluster:
        admin = KubeHttp(api_client)
        admin.json("POST", "/api/v1/namespaces", body={"metadata": {"name": namespace}})
        state = ClusterStage(cluster, admin, namespace)
        job = ["--job", namespace]
        services = {
            "executor": [*kube, "--ack-wait-seconds", str(ACK_WAIT_SECONDS), "--no-managed-only"],
            "planner": [],
            "watcher": [*kube, "--namespace", namespace],
        }
        training = {
            "coordinator": [
                *job, "--dataset", json.dumps(dataset_uris(DATA)), "--epochs", str(EPOCHS),
                "--tick-seconds", "0.2", "--ack-wait-seconds", str(ACK_WAIT_SECONDS),
            ],
            "pserver": [*job, "--index", "0"],
        }  # fmt: skip
        try:
            for name, extra in [*services.items(), *training.items()]:
                port = free_port("127.0.0.1")
                health = ["--health-host", "127.0.0.1", "--health-port", str(port)]
                log = tmp_path / f"{name}.log"
                running = Running(name, state.launch(name, [*extra, *health], log), port, log)
                (state.training if name in training else state.services).append(running)
            for index in range(TRAINERS):
                extra = [*job, "--instance", f"t{index}", "--min-task-seconds", "2"]
                log = tmp_path / f"trainer-{index}.log"
                state.trainers.append(state.launch("trainer", extra, log))
            for service in [*state.services, *state.training]:
                wait_for(service.ready, f"{service.name} ready")
            yield state
        finally:
            end_processes(state.every_process())


def stream_leader(
    loop: asyncio.AbstractEventLoop, bus: Bus, stage: ClusterStage, stream: str
) -> EmbeddedNats:
    """The server leading `stream` (STREAM.INFO's cluster.leader is its server name)."""
    info = loop.run_until_complete(bus.js.stream_info(stream))
    assert info.cluster is not None and info.cluster.leader is not None, f"{stream}: no leader"
    return next(s for s in stage.cluster.servers if f"tideshift-{s.port}" == info.cluster.leader)


def test_stream_leaders_killed_in_a_nats_cluster_lose_nothing(stage: ClusterStage) -> None:
    path = create_web_deployment(stage.admin, stage.namespace, replicas=0, schedulable=False)
    target = events.WorkloadRef(kind="Deployment", namespace=stage.namespace, name="web")
    report = ChaosReport("NATS cluster: stream leaders SIGKILLed (scale, then shard tasks)")
    loop = asyncio.new_event_loop()
    bus = loop.run_until_complete(Bus.connect(stage.cluster.url, name="chaos-publisher"))
    client = loop.run_until_complete(client_of(bus, stage.namespace))

    def applied_batches() -> int:
        try:
            return loop.run_until_complete(applied_total(client)) or 0
        except (TimeoutError, nats.errors.Error):  # asked while a leader is being elected
            return 0

    issued = datetime.now(UTC)
    keys: list[str] = []
    killed: EmbeddedNats | None = None
    try:
        for index in range(COMMANDS):
            if index in KILL_BEFORE:
                share = fault_point_reached(applied_batches, index)
                if killed is not None:  # back on its store, so a quorum survives the next kill
                    killed.start()
                    killed.wait_healthy(60)
                killed = stream_leader(loop, bus, stage, VICTIMS[share - 1])
                killed.kill()
                report.runs += 1
                report.faults += 1
                killed_at = time.monotonic()
            key = f"natscluster-{stage.namespace}-{index}"
            keys.append(key)
            command = numbered_command(target, index, key, issued)
            publish_and_wait_applied(loop, bus, stage.admin, path, command)
            if index in KILL_BEFORE:
                report.recovery_s.append(time.monotonic() - killed_at)
        results_subject = events.SCALE_RESULT.filter(namespace=stage.namespace)

        def every_result() -> list[events.ScaleResult] | None:
            try:
                found = loop.run_until_complete(
                    read_stored(bus, results_subject, stream=SCALE_STREAM)
                )
            except (TimeoutError, nats.errors.Error):  # asked while a leader is being elected
                return None
            return found if {result.idempotency_key for result in found} >= set(keys) else None

        stored_results: list[events.ScaleResult] = wait_for(
            every_result, "a result for every command"
        )
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
    assert max(report.recovery_s) < RECOVERY_BOUND_SECONDS, report.recovery_s
    assert stage.admin.get(path)["spec"]["replicas"] == COMMANDS
    assert all(trainer.wait(15) == 0 for trainer in stage.trainers), "trainers leave when done"
