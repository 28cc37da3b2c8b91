"""Watcher and executor over the simulated cluster and a real nats-server.

The Kubernetes-specific behaviour (410, apiserver restarts, adapters, RBAC) is in
tests/k8s/; here the bus side is proven: events, the KV snapshot, durable consumption,
idempotency, results before acks, and the `tideshift scale` path.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from tideshift.events import (
    POD_CHANGED,
    SCALE_COMMAND,
    SCALE_RESULT,
    PodChanged,
    ScaleCommand,
    ScaleResult,
    WorkloadRef,
)
from tideshift.services.cluster.port import Node, Resources
from tideshift.services.cluster.sim import SimCluster, SimClusterPort, SimWorkload
from tideshift.services.common.bus import Bus
from tideshift.services.executor.executor import Executor, RecordStore
from tideshift.services.executor.scale_cli import scale
from tideshift.services.executor.service import consume
from tideshift.services.watcher.core.snapshot import pod_key
from tideshift.services.watcher.watcher import Watcher

WAIT = 20.0
T0 = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)


def sim_cluster(namespace: str, *, replicas: int = 2, low: int = 0, high: int | None = None) -> Any:
    cluster = SimCluster(now=0.0)
    cluster.add_node(Node("n1", Resources(cpu=32, memory=128 * 2**30)))
    cluster.add_workload(
        SimWorkload(
            ref=WorkloadRef(namespace, "Deployment", "web"),
            kind="Deployment",
            role="serving",
            pod_requests=Resources(cpu=0.5),
            replicas=replicas,
            min_replicas=low,
            max_replicas=high,
        )
    )
    return cluster


async def collect(iterator: AsyncIterator[Any], into: list[Any]) -> None:
    async for item in iterator:
        into.append(item)


async def eventually(check: Any, what: str) -> None:
    deadline = asyncio.get_running_loop().time() + WAIT
    while not check():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.02)


@contextlib.asynccontextmanager
async def running(coroutine: Any) -> AsyncIterator[asyncio.Task[Any]]:
    task = asyncio.ensure_future(coroutine)
    try:
        yield task
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


# ---- watcher -----------------------------------------------------------------------------


async def test_watcher_publishes_pod_events_and_keeps_the_snapshot(bus: Bus, unique: str) -> None:
    namespace = f"w-{unique}"
    cluster = sim_cluster(namespace)
    bucket = f"snap_{unique}"
    events: list[Any] = []
    watcher = Watcher(SimClusterPort(cluster), bus, bucket=bucket)
    ready = asyncio.Event()
    async with (
        running(
            collect(bus.subscribe(POD_CHANGED.filter(namespace=namespace), consumer="t"), events)
        ),
        running(watcher.run(ready)),
    ):
        await asyncio.wait_for(ready.wait(), WAIT)
        cluster.step(1.0)  # two pods created and bound
        await eventually(
            lambda: sum(1 for e in events if e.data.node is not None) >= 2, "two bound pods"
        )
        event: PodChanged = events[0].data
        assert event.owner == WorkloadRef(kind="Deployment.apps", namespace=namespace, name="web")
        assert event.role == "serving" and event.requests.cpu == 0.5
        await watcher.flushed()
        snapshot = await bus.kv(bucket)
        keys = [key for key in await snapshot.keys() if key.startswith("pod.")]
        assert len(keys) == 2
        stored = await snapshot.get(keys[0], PodChanged)
        assert stored is not None and stored.node == "n1"

        cluster.scale(WorkloadRef(namespace, "Deployment", "web"), 1)
        cluster.step(2.0)
        await eventually(lambda: any(e.data.change == "deleted" for e in events), "a deletion")
        deleted = next(e.data for e in events if e.data.change == "deleted")
        await watcher.flushed()
        assert await snapshot.get(pod_key(namespace, deleted.name), PodChanged) is None


async def test_a_late_watcher_publishes_only_what_changed(bus: Bus, unique: str) -> None:
    namespace = f"w-{unique}"
    cluster = sim_cluster(namespace, replicas=3)
    cluster.step(1.0)
    bucket = f"snap_{unique}"
    first = Watcher(SimClusterPort(cluster), bus, bucket=bucket)
    assert await first.reconcile() == 4  # one node, three pods
    await first.reconcile()  # nothing new: a restart alone publishes nothing
    async with running(first._snapshot_writer()):
        await first.flushed()
    second_check = Watcher(SimClusterPort(cluster), bus, bucket=bucket)
    assert await second_check.reconcile() == 0

    # While no watcher runs: one pod goes away, a node arrives.
    cluster.scale(WorkloadRef(namespace, "Deployment", "web"), 2)
    cluster.step(2.0)
    cluster.add_node(Node("n2", Resources(cpu=4)))
    events: list[Any] = []
    async with running(
        collect(bus.subscribe(POD_CHANGED.filter(namespace=namespace), consumer="t"), events)
    ):
        await asyncio.sleep(0.05)
        await bus.flush()
        late = Watcher(SimClusterPort(cluster), bus, bucket=bucket)
        assert await late.reconcile() == 2
        await eventually(lambda: len(events) == 1, "the deletion event")
    assert events[0].data.change == "deleted"


# ---- executor ----------------------------------------------------------------------------


def command(
    namespace: str, desired: int, key: str, *, issued_at: datetime = T0, name: str = "web"
) -> ScaleCommand:
    return ScaleCommand(
        target=WorkloadRef(kind="Deployment.apps", namespace=namespace, name=name),
        desired=desired,
        reason="test",
        plan_id="p",
        issued_at=issued_at,
        idempotency_key=key,
    )


async def executor_for(bus: Bus, cluster: SimCluster, unique: str, **options: Any) -> Executor:
    records = RecordStore(await bus.kv(f"exec_{unique}"))
    return Executor(SimClusterPort(cluster), records, name="test", **options)


async def publish(bus: Bus, cmd: ScaleCommand) -> None:
    subject = SCALE_COMMAND.at(
        namespace=cmd.target.namespace, kind=cmd.target.kind, name=cmd.target.name
    )
    await bus.publish_durable(subject, cmd)


class Results:
    """Scale results received on core NATS for one namespace, as they arrive."""

    def __init__(self) -> None:
        self.envelopes: list[Any] = []

    def __len__(self) -> int:
        return len(self.envelopes)

    def __getitem__(self, index: int) -> ScaleResult:
        result: ScaleResult = self.envelopes[index].data
        return result

    def all(self) -> list[ScaleResult]:
        return [envelope.data for envelope in self.envelopes]


@pytest.fixture
def results_of(bus: Bus) -> Any:
    @contextlib.asynccontextmanager
    async def subscribe(namespace: str) -> AsyncIterator[Results]:
        results = Results()
        subject = SCALE_RESULT.filter(namespace=namespace)
        async with running(collect(bus.subscribe(subject, consumer="t"), results.envelopes)):
            await asyncio.sleep(0.05)
            yield results

    return subscribe


async def test_commands_apply_once_and_replays_and_stale_ones_are_noops(
    bus: Bus, unique: str, results_of: Any
) -> None:
    namespace = f"x-{unique}"
    cluster = sim_cluster(namespace)
    executor = await executor_for(bus, cluster, unique)
    ref = WorkloadRef(namespace, "Deployment", "web")
    async with (
        results_of(namespace) as results,
        running(
            consume(
                executor,
                bus,
                durable=f"exec-{unique}",
                subject=SCALE_COMMAND.filter(namespace=namespace),
            )
        ),
    ):
        await publish(bus, command(namespace, 5, "k1"))
        await eventually(lambda: len(results) == 1, "first result")
        assert (results[0].outcome, results[0].previous, results[0].current) == ("applied", 2, 5)
        assert cluster.workload(ref).replicas == 5

        await publish(bus, command(namespace, 5, "k1"))  # replay
        await publish(bus, command(namespace, 1, "k0", issued_at=T0 - timedelta(minutes=1)))
        await publish(bus, command(namespace, 4, "k2", issued_at=T0 + timedelta(minutes=1)))
        await eventually(lambda: len(results) == 4, "four results")
        by_key = {result.idempotency_key: result for result in results.all()}
        assert by_key["k0"].outcome == "noop" and by_key["k0"].message.startswith("stale")
        assert by_key["k2"].outcome == "applied" and by_key["k2"].current == 4
        assert cluster.workload(ref).replicas == 4
    info = await bus.js.consumer_info("TIDESHIFT_SCALE", f"exec-{unique}")
    assert info.num_ack_pending == 0 and info.num_pending == 0  # every command acked


async def test_bounds_max_step_dry_run_and_unknown_targets(
    bus: Bus, unique: str, results_of: Any
) -> None:
    namespace = f"x-{unique}"
    cluster = sim_cluster(namespace, replicas=2, high=8)
    ref = WorkloadRef(namespace, "Deployment", "web")
    limited = await executor_for(bus, cluster, unique, max_step=3)
    dry = await executor_for(bus, cluster, unique + "d", dry_run=True)

    result = await dry.handle(command(namespace, 6, "d1"))
    assert (result.outcome, result.dry_run, result.current) == ("applied", True, 6)
    assert cluster.workload(ref).replicas == 2  # nothing written

    result = await limited.handle(command(namespace, 100, "b1"))
    assert (result.outcome, result.current) == ("applied", 5)  # max 8, then +3 at most
    assert "clamped" in result.message and "step limited" in result.message

    result = await limited.handle(command(namespace, 3, "u1", name="nope"))
    assert result.outcome == "rejected" and "not found" in result.message


async def test_scale_cli_path_and_two_executors_sharing_the_durable(
    bus: Bus, nats_server: Any, unique: str
) -> None:
    namespace = f"x-{unique}"
    cluster = SimCluster(now=0.0)
    names = [f"svc{i}" for i in range(12)]
    for name in names:
        cluster.add_workload(
            SimWorkload(
                ref=WorkloadRef(namespace, "Deployment", name),
                kind="Deployment",
                role="serving",
                pod_requests=Resources(cpu=0.1),
                replicas=1,
            )
        )
    second_bus = await Bus.connect(nats_server.url, name="second-executor")
    first = await executor_for(bus, cluster, unique)
    second = await executor_for(second_bus, cluster, unique)
    subject = SCALE_COMMAND.filter(namespace=namespace)
    results: list[Any] = []
    try:
        async with (
            running(
                collect(
                    bus.subscribe(SCALE_RESULT.filter(namespace=namespace), consumer="t"), results
                )
            ),
            running(consume(first, bus, durable=f"shared-{unique}", subject=subject)),
            running(consume(second, second_bus, durable=f"shared-{unique}", subject=subject)),
        ):
            await asyncio.sleep(0.05)
            target = WorkloadRef(kind="Deployment", namespace=namespace, name="svc0")
            outcome = await scale(bus, target, 3, reason="operator", timeout=WAIT)
            assert outcome is not None and outcome.outcome == "applied" and outcome.current == 3
            for index, name in enumerate(names[1:], start=1):
                await publish(bus, command(namespace, index + 1, f"c{index}", name=name))
            await eventually(lambda: len(results) == len(names), "one result per command")
            await asyncio.sleep(0.2)
            assert len(results) == len(names)  # nothing handled twice
    finally:
        await second_bus.close()
    assert {r.data.idempotency_key for r in results} >= {f"c{i}" for i in range(1, len(names))}
    for index, name in enumerate(names[1:], start=1):
        assert cluster.workload(WorkloadRef(namespace, "Deployment", name)).replicas == index + 1
