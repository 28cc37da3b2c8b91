"""Chaos scenario 1: an executor SIGKILLed between the apiserver write and its ack, many times
in a row, with a standby executor taking over each time. Every scale command must be applied
exactly once (0 lost, 0 doubled) and the final replicas must equal the last command.

Real processes (`tideshift run executor`), the real nats-server (JetStream file store) and the
real control plane. Each executor reaches NATS through a relay (tests/chaos/proxy.py): once
the executor has claimed the command in KV its outgoing NATS traffic is held, so it writes to
the apiserver and then cannot ack; the test sees the write, SIGKILLs it and opens the
standby's relay. The standby gets the redelivered command after the ack wait.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
import uuid
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from tests.chaos.objects import create_web_deployment
from tests.chaos.proxy import HoldableRelay
from tests.chaos.report import ChaosReport
from tests.chaos.stored import read_stored
from tideshift import events
from tideshift.events import EXECUTOR_RECORDS_BUCKET
from tideshift.services.cluster.adapters.http import KubeHttp
from tideshift.services.common.bus import SCALE_STREAM, Bus
from tideshift.services.common.embedded_nats import EmbeddedNats
from tideshift.services.executor.core.decision import AppliedRecord
from tideshift.services.executor.executor import record_key

pytestmark = pytest.mark.slow

# The 50 kills in a row; each costs a fresh executor process (about 1 s idle, 2-3 s of
# imports on a busy machine). TIDESHIFT_CHAOS_EXECUTOR_KILLS sets another count.
KILLS = int(os.environ.get("TIDESHIFT_CHAOS_EXECUTOR_KILLS", "50"))
WAIT = 30.0
ACK_WAIT_SECONDS = 1.0
STANDBYS = 2  # started ahead: one importing while the other waits to take over
TIDESHIFT = str(Path(sys.executable).parent / "tideshift")


@dataclass
class Executor:
    process: subprocess.Popen[bytes]
    relay: HoldableRelay

    def kill(self) -> None:
        self.process.send_signal(signal.SIGKILL)
        self.process.wait(WAIT)
        self.relay.close()


def wait_for(check: Callable[[], Any], what: str, timeout: float = WAIT) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        result = check()
        if result:
            return result
        time.sleep(0.005)
    raise AssertionError(f"timed out waiting for {what}")


class Harness:
    def __init__(self, nats: EmbeddedNats, kubeconfig: str, admin: KubeHttp, logs: Path) -> None:
        self.nats = nats
        self.kubeconfig = kubeconfig
        self.admin = admin
        self.logs = logs
        self.started = 0
        self.loop = asyncio.new_event_loop()
        self.bus = self.loop.run_until_complete(Bus.connect(nats.url, name="chaos-test"))
        self.loop.run_until_complete(self.bus.ensure_streams())

    def run(self, coroutine: Any) -> Any:
        return self.loop.run_until_complete(coroutine)

    def executor(self, *, gated: bool) -> Executor:
        relay = HoldableRelay(self.nats.port, gated=gated)
        self.started += 1
        log = (self.logs / f"executor-{self.started}.log").open("ab")
        argv = [
            *(TIDESHIFT, "run", "executor", "--nats-url", relay.url, "--health-port", "-1"),
            *("--kubeconfig", self.kubeconfig, "--ack-wait-seconds", str(ACK_WAIT_SECONDS)),
            *("--instance", f"chaos-{self.started}", "--no-compaction"),
            # admission (managed-only) has its own tests; these scale an unlabelled `web`
            "--no-managed-only",
        ]
        process = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        log.close()
        return Executor(process, relay)

    def record(self, target: events.WorkloadRef) -> tuple[str, bool] | None:
        """The executors' KV record of the target: (command key, applied)."""

        async def read() -> AppliedRecord | None:
            records = await self.bus.kv(EXECUTOR_RECORDS_BUCKET)
            return await records.get(record_key(target), AppliedRecord)

        record = self.run(read())
        return None if record is None else (record.idempotency_key, record.applied)

    def publish_and_hold_at_claim(
        self, command: events.ScaleCommand, subject: str, hold: Callable[[], None]
    ) -> bool:
        """Publish `command`; the moment its claim shows in KV, call `hold`. True when the
        claim was seen before the executor marked it applied (the hold came in time)."""

        async def go() -> bool:
            kv = (await self.bus.kv(EXECUTOR_RECORDS_BUCKET)).raw
            watcher = await kv.watch(record_key(command.target))
            try:
                await self.bus.js.publish(
                    subject,
                    events.encode(command, source="chaos"),
                    headers={"Nats-Msg-Id": command.idempotency_key},
                )
                deadline = time.monotonic() + WAIT
                while time.monotonic() < deadline:
                    entry = await watcher.updates(timeout=WAIT)
                    if entry is None or not entry.value:
                        continue  # the end of the initial values, or a delete
                    record = AppliedRecord.model_validate_json(entry.value)
                    if record.idempotency_key == command.idempotency_key:
                        hold()
                        return not record.applied
                raise AssertionError(f"no claim of {command.idempotency_key}")
            finally:
                await watcher.stop()

        return self.run(go())  # type: ignore[no-any-return]

    def close(self) -> None:
        self.run(self.bus.close())
        self.loop.close()


@pytest.fixture
def harness(k8s_cluster: Any, tmp_path: Path) -> Iterator[Harness]:
    with (
        k8s_cluster.api_client() as api_client,
        EmbeddedNats(store_dir=tmp_path / "nats") as nats,
    ):
        state = Harness(nats, str(k8s_cluster.kubeconfig), KubeHttp(api_client), tmp_path)
        try:
            yield state
        finally:
            state.close()


def _deployment(admin: KubeHttp, namespace: str) -> str:
    admin.json("POST", "/api/v1/namespaces", body={"metadata": {"name": namespace}})
    return create_web_deployment(admin, namespace, replicas=0, schedulable=False)


def test_executor_killed_between_write_and_ack_applies_every_command_once(
    harness: Harness,
) -> None:
    namespace = f"t-chaos-{uuid.uuid4().hex[:6]}"
    path = _deployment(harness.admin, namespace)
    generation_before = harness.admin.get(path)["metadata"]["generation"]
    target = events.WorkloadRef(kind="Deployment", namespace=namespace, name="web")
    subject = events.SCALE_COMMAND.at(namespace=namespace, kind=target.kind, name=target.name)
    report = ChaosReport("1. executor SIGKILLed between apiserver write and ack")
    active = harness.executor(gated=False)
    # Standbys start ahead (their imports take seconds) and wait on their gated relays.
    standbys = deque(harness.executor(gated=True) for _ in range(STANDBYS))
    issued = datetime.now(UTC)
    keys: list[str] = []
    started = time.monotonic()
    between_write_and_ack = 0
    try:
        for run in range(KILLS):
            desired = run + 1
            key = f"chaos-{namespace}-{run}"
            keys.append(key)
            command = events.ScaleCommand(
                target=target,
                desired=desired,
                reason="chaos",
                plan_id=f"plan-{run}",
                issued_at=issued + timedelta(seconds=run),
                idempotency_key=key,
            )
            in_window = harness.publish_and_hold_at_claim(
                command, subject.value, active.relay.hold_outbound
            )
            wait_for(
                lambda d=desired: harness.admin.get(path)["spec"]["replicas"] == d,
                f"write of {desired}",
            )
            active.kill()
            killed_at = time.monotonic()
            report.runs += 1
            report.faults += 1
            between_write_and_ack += in_window
            standby = standbys.popleft()
            standby.relay.open()
            wait_for(lambda k=key: harness.record(target) == (k, True), f"{key} taken over")
            report.recovery_s.append(time.monotonic() - killed_at)
            active = standby
            standbys.append(harness.executor(gated=True))
        # The last executor standing finishes normally: no command is left unacked.
        wait_for(lambda: harness.run(_unfinished(harness.bus)) == 0, "every command acked")
    finally:
        for executor in (active, *standbys):
            executor.kill()
    results = harness.run(
        read_stored(
            harness.bus, events.SCALE_RESULT.filter(namespace=namespace), stream=SCALE_STREAM
        )
    )
    deployment = harness.admin.get(path)
    applied_per_key = {key: 0 for key in keys}
    for result in results:
        report.checked += 1
        # A command redelivered once more after a newer one was applied is refused as stale
        # (`noop`); only `applied` results wrote, and each wrote its own command's value.
        if result.outcome == "applied":
            applied_per_key[result.idempotency_key] += 1
            assert result.current == result.desired
    report.lost += sum(
        1 for key in keys if key not in {result.idempotency_key for result in results}
    )
    # Each command changed the spec once: the generation counts spec changes, so a command
    # applied twice after a newer one (a step back and forth) would show here.
    spec_changes = deployment["metadata"]["generation"] - generation_before
    report.doubled += max(0, spec_changes - KILLS) + sum(
        1 for count in applied_per_key.values() if count > 1
    )
    report.print()
    print(
        f"{KILLS} kills in {time.monotonic() - started:.1f} s, {between_write_and_ack} of them "
        "after the apiserver write and before the ack"
    )
    assert (report.lost, report.doubled) == (0, 0)
    assert spec_changes == KILLS
    assert deployment["spec"]["replicas"] == KILLS, "the final replicas equal the last command"


async def _unfinished(bus: Bus) -> int:
    """Commands the executors' durable consumer has not acked yet (pending or in flight)."""
    info = await bus.js.consumer_info(SCALE_STREAM.name, "tideshift-executor")
    return int(info.num_pending) + int(info.num_ack_pending)
