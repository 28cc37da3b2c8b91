"""The real planner process (`tideshift run planner`) on a real nats-server under a burst of
cluster events: 8,000 pod events published as fast as the bus takes them while a forecast
jumps. Its view of the cluster ends equal to the truth (its `tideshift_planner_cluster_objects`
gauge, set by each plan), nothing was dropped (no slow consumer in its log), and the
command for the jump arrives. Waits are on conditions with timeouts; nothing times speed."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.integration.planner.test_planner_service import forecast
from tests.k8s.cluster_objects import end_processes
from tideshift.events import (
    FORECAST,
    NODE_CHANGED,
    POD_CHANGED,
    SCALE_COMMAND,
    NodeChanged,
    PodChanged,
    Resources,
    ScaleCommand,
)
from tideshift.services.common.bus import Bus
from tideshift.services.common.embedded_nats import EmbeddedNats
from tideshift.services.common.ports import free_port

TIDESHIFT = str(Path(sys.executable).parent / "tideshift")
NAMESPACE = "burst"
NODES = 20
PODS = 3000  # each added (Pending), then scheduled; the first DELETED of them deleted
DELETED = 2000
WAIT_S = 90.0
GIB = 2**30


def serving() -> str:
    return json.dumps(
        [
            {
                "namespace": NAMESPACE,
                "name": "web",
                "cpu": 1.0,
                "memory": GIB,
                "capacity_rps": 100.0,
                "min_replicas": 1,
                "max_replicas": 64,
                "lead_time_s": 30.0,
                "margin_s": 30.0,
                "stabilization_s": 0.0,
            }
        ]
    )


def http_get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=5) as answer:
        return str(answer.read().decode())


async def eventually(check: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while not await asyncio.to_thread(check):
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {WAIT_S:.0f}s: {what}")
        await asyncio.sleep(0.2)


class PlannerProcess:
    def __init__(self, nats: EmbeddedNats, log: Path) -> None:
        self.port = free_port()
        self.log = log
        argv = [TIDESHIFT, "run", "planner", "--nats-url", nats.url, "--serving", serving()]
        argv += ["--health-host", "127.0.0.1", "--health-port", str(self.port)]
        argv += ["--tick-seconds", "5", "--log-level", "WARNING"]
        with log.open("ab") as out:
            self.process = subprocess.Popen(
                argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT
            )

    def ready(self) -> bool:
        assert self.process.poll() is None, self.log.read_text(errors="replace")
        try:
            http_get(f"http://127.0.0.1:{self.port}/readyz")
        except (urllib.error.URLError, OSError):
            return False
        return True

    def view(self) -> dict[str, float]:
        """Nodes and pods in its last plan's inputs, by kind."""
        text = http_get(f"http://127.0.0.1:{self.port}/metrics")
        return {
            sample.labels["kind"]: sample.value
            for family in text_string_to_metric_families(text)
            if family.name == "tideshift_planner_cluster_objects"
            for sample in family.samples
        }


@pytest.fixture
async def setup(tmp_path: Path) -> AsyncIterator[tuple[Bus, PlannerProcess]]:
    with EmbeddedNats(store_dir=tmp_path / "nats") as nats:
        planner = PlannerProcess(nats, tmp_path / "planner.log")
        bus = await Bus.connect(nats.url, name="burst-test")
        try:
            await bus.ensure_streams()
            yield bus, planner
        finally:
            await bus.close()
            end_processes([planner.process])


def pod(index: int, change: str, node: str | None) -> PodChanged:
    return PodChanged(
        change=change,
        namespace=NAMESPACE,
        name=f"p-{index}",
        phase="Running" if node else "Pending",
        node=node,
        requests=Resources(cpu=0.1, memory=GIB / 8),
        observed_at=datetime.now(UTC),
    )


async def test_a_burst_of_pod_events_while_a_forecast_jumps(
    setup: tuple[Bus, PlannerProcess],
) -> None:
    bus, planner = setup
    commands: list[ScaleCommand] = []

    async def collect() -> None:
        async for envelope in bus.subscribe(SCALE_COMMAND.filter(), consumer="burst-commands"):
            commands.append(envelope.data)

    collector = asyncio.create_task(collect())
    try:
        await eventually(planner.ready, "the planner answers /readyz")
        for n in range(NODES):
            node = NodeChanged(
                change="added",
                name=f"n-{n}",
                allocatable=Resources(cpu=16, memory=64 * GIB),
                observed_at=datetime.now(UTC),
            )
            await bus.publish(NODE_CHANGED.at(name=node.name), node)
        web = FORECAST.at(namespace=NAMESPACE, workload="web")
        await bus.publish(web, forecast(NAMESPACE, 200.0))
        await eventually(lambda: bool(commands), "a first command for web")
        before = max(c.desired for c in commands)

        steps: list[tuple[int, str, str | None]] = [(i, "added", None) for i in range(PODS)]
        steps += [(i, "modified", f"n-{i % NODES}") for i in range(PODS)]
        steps += [(i, "deleted", f"n-{i % NODES}") for i in range(DELETED)]
        for step, (index, change, node_name) in enumerate(steps):
            if step == len(steps) // 2:  # the jump lands in the middle of the burst
                await bus.publish(web, forecast(NAMESPACE, 3000.0))
            subject = POD_CHANGED.at(namespace=NAMESPACE, name=f"p-{index}")
            await bus.publish(subject, pod(index, change, node_name))
        await bus.flush()

        await eventually(
            lambda: any(c.desired >= 30 > before for c in commands), "the jump's command"
        )
        truth = {"node": float(NODES), "pod": float(PODS - DELETED)}
        await eventually(lambda: planner.view() == truth, f"the planner's view is {truth}")
        log = planner.log.read_text(errors="replace")
        assert "slow consumer" not in log, log[-2000:]
    finally:
        collector.cancel()
        await asyncio.gather(collector, return_exceptions=True)
