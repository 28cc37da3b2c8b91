"""Hostile input to every subject the running services consume, on a real nats-server.

The planner, the executor and the watcher run as processes (`tideshift run ...`) against a real
control plane. Each consumed subject gets the corpus in tests/fuzz/corpus/, two generated
monsters (100,000-deep nesting, an oversized payload) and hypothesis-made mutations of a valid
event. Afterwards every service is alive and /readyz ready, the dead letters of each consumer
equal what it was sent that the contract refuses, and a normal message sent last is still
processed (the executor scales a real Deployment).
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.chaos.objects import create_web_deployment
from tests.fuzz.hostile import Service, corpus, mutations, one_seeded_draw, refused
from tideshift import events
from tideshift.services.cluster.adapters.http import KubeHttp
from tideshift.services.common.bus import DEAD_LETTER_STREAM, Bus
from tideshift.services.common.embedded_nats import EmbeddedNats
from tideshift.services.common.ports import free_port

pytestmark = pytest.mark.slow

WAIT = 60.0
NOW = datetime(2026, 1, 1, tzinfo=UTC)
TIDESHIFT = str(Path(sys.executable).parent / "tideshift")


def valid_examples(namespace: str) -> dict[str, tuple[str, events.EventData]]:
    """One valid event per consumed subject: (concrete subject, payload)."""
    ref = events.WorkloadRef(kind="Deployment", namespace=namespace, name="web")
    pod = events.PodChanged(
        change="added", namespace=namespace, name="p", phase="Running", observed_at=NOW
    )
    node = events.NodeChanged(
        change="added", name=f"n-{namespace}", allocatable=events.Resources(cpu=4), observed_at=NOW
    )
    point = events.ForecastPoint(at=NOW, point=1, q50=1, q90=2, q95=3, q99=4)
    forecast = events.ForecastIssued(
        workload=ref, issued_at=NOW, step_seconds=60, model="m", points=(point,)
    )
    result = events.ScaleResult(
        target=ref, idempotency_key="k", outcome="noop", desired=1, executed_at=NOW
    )
    command = events.ScaleCommand(
        target=ref, desired=1, reason="fuzz", plan_id="p", issued_at=NOW, idempotency_key="k"
    )
    return {
        "pod": (events.POD_CHANGED.at(namespace=namespace, name="p").value, pod),
        "node": (events.NODE_CHANGED.at(name=node.name).value, node),
        "forecast": (_subject(events.FORECAST, ref), forecast),
        "result": (_subject(events.SCALE_RESULT, ref), result),
        "command": (_subject(events.SCALE_COMMAND, ref), command),
    }


def _subject(subject: events.Subject[Any], ref: events.WorkloadRef) -> str:
    """The subject filled in with `ref` (parameters other than namespace get a fixed token)."""
    values = {param: ref.namespace if param == "namespace" else "fuzz" for param in subject.params}
    return subject.at(**values).value


# -- the running system ------------------------------------------------------------------------


@dataclass
class System:
    nats: EmbeddedNats
    namespace: str
    admin: KubeHttp
    services: dict[str, Service] = field(default_factory=dict)

    def alive(self) -> None:
        for service in self.services.values():
            assert service.process.poll() is None, (
                f"{service.name} exited: {service.log.read_text()[-3000:]}"
            )


def health(port: int) -> list[str]:
    return ["--health-host", "127.0.0.1", "--health-port", str(port)]


def wait_until(check: Callable[[], Any], what: str, system: System) -> Any:
    deadline = time.monotonic() + WAIT
    while time.monotonic() < deadline:
        system.alive()
        result = check()
        if result:
            return result
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.fixture(scope="module")
def system(k8s_cluster: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[System]:
    namespace = f"t-fuzz-{uuid.uuid4().hex[:6]}"
    logs = tmp_path_factory.mktemp("fuzz-logs")
    kubeconfig = str(k8s_cluster.kubeconfig)
    with k8s_cluster.api_client() as api_client, EmbeddedNats() as nats:
        admin = KubeHttp(api_client)
        admin.json("POST", "/api/v1/namespaces", body={"metadata": {"name": namespace}})
        state = System(nats, namespace, admin)
        kube = ["--kubeconfig", kubeconfig]
        argvs = {
            "planner": ["--instance", "fuzz"],
            # admission (managed-only) has its own tests; these scale an unlabelled Deployment `web`
            "executor": ["--instance", "fuzz", *kube, "--no-managed-only"],
            "watcher": ["--instance", "fuzz", "--namespace", namespace, *kube],
        }
        try:
            for name, extra in argvs.items():
                port = free_port("127.0.0.1")
                log = logs / f"{name}.log"
                with log.open("ab") as handle:
                    process = subprocess.Popen(
                        [TIDESHIFT, "run", name, "--nats-url", nats.url, *health(port), *extra],
                        stdin=subprocess.DEVNULL,
                        stdout=handle,
                        stderr=handle,
                    )
                state.services[name] = Service(name, process, port, log)
            for service in state.services.values():
                wait_until(lambda s=service: s.get("/readyz")[0] == 200, f"{service.name}", state)
            yield state
        finally:
            for service in state.services.values():
                service.process.terminate()
            for service in state.services.values():
                try:
                    service.process.wait(15)
                except subprocess.TimeoutExpired:
                    service.process.kill()
                    service.process.wait()


async def _publish_all(url: str, batches: list[tuple[str, bool, bytes]]) -> None:
    bus = await Bus.connect(url, name="fuzzer")
    try:
        for subject, durable, payload in batches:
            if durable:
                await bus.js.publish(subject, payload)
            else:
                await bus.connection.publish(subject, payload)
                await bus.flush()  # paced: a core subscriber's buffer is not what is tested
    finally:
        await bus.close()


async def _dead_letters(url: str, consumer: str) -> int:
    bus = await Bus.connect(url, name="fuzz-reader")
    try:
        return await bus.queued(events.DEAD_LETTER.at(consumer=consumer), stream=DEAD_LETTER_STREAM)
    finally:
        await bus.close()


@one_seeded_draw
@given(data=st.data())
def test_every_consumer_survives_hostile_input_and_accounts_for_it(
    system: System, data: st.DataObject
) -> None:
    namespace = system.namespace
    examples = valid_examples(namespace)
    # Which dead-letter consumer name (planner-<instance>, the executor's durable) takes which
    # subjects; the watcher consumes nothing from NATS.
    consumers = {
        "planner-fuzz": ["pod", "node", "forecast", "result"],
        "tideshift-executor": ["command"],
    }
    batches: list[tuple[str, bool, bytes]] = []
    expected_letters = {}
    hostile = corpus()
    for consumer, kinds in consumers.items():
        letters = 0
        for kind in kinds:
            subject, valid = examples[kind]
            encoded = events.encode(valid, source="fuzz")
            generated = data.draw(st.lists(mutations(encoded), min_size=25, max_size=25), kind)
            durable = kind == "command"
            for payload in [*hostile.values(), *generated]:
                if refused(payload, type(valid)):
                    letters += 1
                    batches.append((subject, durable, payload))
        expected_letters[consumer] = letters
    asyncio.run(_publish_all(system.nats.url, batches))

    for consumer, letters in expected_letters.items():
        wait_until(
            lambda c=consumer, n=letters: asyncio.run(_dead_letters(system.nats.url, c)) >= n,
            f"{letters} dead letters from {consumer}",
            system,
        )
        assert asyncio.run(_dead_letters(system.nats.url, consumer)) == letters
    planner, executor = system.services["planner"], system.services["executor"]
    assert (
        planner.metric("tideshift_bus_rejected_total", consumer="planner-fuzz")
        == (expected_letters["planner-fuzz"])
    )
    assert (
        executor.metric("tideshift_bus_rejected_total", consumer="tideshift-executor")
        == (expected_letters["tideshift-executor"])
    )

    # A normal message sent last is still processed: the executor scales a real Deployment.
    create_web_deployment(system.admin, system.namespace, replicas=1)
    command = events.ScaleCommand(
        target=events.WorkloadRef(kind="Deployment", namespace=namespace, name="web"),
        desired=3,
        reason="after the fuzz",
        plan_id="fuzz-last",
        issued_at=datetime.now(UTC),
        idempotency_key=f"fuzz-last-{uuid.uuid4().hex[:6]}",
    )
    asyncio.run(_publish_command(system.nats.url, command))
    path = f"/apis/apps/v1/namespaces/{namespace}/deployments/web"
    wait_until(
        lambda: system.admin.get(path)["spec"]["replicas"] == 3, "the last command applied", system
    )
    received_before = planner.metric("tideshift_bus_received_total", consumer="planner-fuzz")
    asyncio.run(_publish_valid(system.nats.url, *examples["pod"]))
    wait_until(
        lambda: (
            planner.metric("tideshift_bus_received_total", consumer="planner-fuzz")
            > received_before
        ),
        "the planner to take a valid pod event",
        system,
    )
    for service in system.services.values():
        status, body = service.get("/readyz")
        assert status == 200, f"{service.name}: {body}"


async def _publish_command(url: str, command: events.ScaleCommand) -> None:
    bus = await Bus.connect(url, name="fuzz-last")
    try:
        subject = events.SCALE_COMMAND.at(
            namespace=command.target.namespace, kind=command.target.kind, name=command.target.name
        )
        await bus.publish_durable(subject, command, msg_id=command.idempotency_key)
    finally:
        await bus.close()


async def _publish_valid(url: str, subject: str, data: events.EventData) -> None:
    bus = await Bus.connect(url, name="fuzz-valid")
    try:
        await bus.connection.publish(subject, events.encode(data, source="fuzz"))
        await bus.flush()
    finally:
        await bus.close()
