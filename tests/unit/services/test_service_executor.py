"""The executor service on the in-memory bus and virtual time: a command becomes a scale and a
result; a transient failure is handed back and retried after its delay in clock time; one that
keeps failing is reported failed after `max_attempts` deliveries."""

from __future__ import annotations

import functools
from typing import Any

from tests.fixtures.support import collect, eventually, running, scale_command
from tideshift import events
from tideshift.services.cluster.port import ClusterError, ScaleState
from tideshift.services.cluster.port import Resources as PortResources
from tideshift.services.cluster.sim import SimCluster, SimClusterPort, SimWorkload
from tideshift.services.common.bus.memory import MemoryBroker, MemoryBus
from tideshift.services.common.clock import ManualClock
from tideshift.services.executor import service as executor_service
from tideshift.services.executor.service import COMMAND_RETRY, ExecutorSettings

NS = "shop"
WEB = events.WorkloadRef(kind="Deployment", namespace=NS, name="web")


def cluster() -> SimCluster:
    made = SimCluster(now=0.0)
    made.add_workload(
        SimWorkload(
            ref=WEB,
            kind="Deployment",
            role="serving",
            pod_requests=PortResources(cpu=0.5),
            replicas=2,
        )
    )
    return made


class Flaky(SimClusterPort):
    """The simulated cluster, whose first `failures` scale reads fail (transiently)."""

    def __init__(self, cluster: SimCluster, failures: int) -> None:
        super().__init__(cluster)
        self.failures = failures
        self.reads = 0

    async def get_scale(self, target: events.WorkloadRef) -> ScaleState:
        self.reads += 1
        if self.reads <= self.failures:
            raise ClusterError("apiserver unreachable", transient=True)
        return await super().get_scale(target)


def settings(**overrides: Any) -> ExecutorSettings:
    return ExecutorSettings(health_port=-1, **overrides)


async def publish(bus: MemoryBus, command: events.ScaleCommand) -> None:
    subject = events.SCALE_COMMAND.at(namespace=NS, kind="Deployment", name="web")
    await bus.publish_durable(subject, command, msg_id=command.idempotency_key)


async def test_a_command_is_applied_and_its_result_published(
    broker: MemoryBroker, bus: MemoryBus, clock: ManualClock
) -> None:
    sim = cluster()
    results: list[events.ScaleResult] = []
    collecting = await collect(bus, events.SCALE_RESULT.filter(), results)
    body = functools.partial(
        executor_service.serve, settings(), clock=clock, cluster=SimClusterPort(sim)
    )
    async with running(broker, "executor", settings(), body):
        await publish(bus, scale_command(NS, desired=5))
        await eventually(lambda: results)
    collecting.cancel()
    assert [(r.outcome, r.previous, r.current) for r in results] == [("applied", 2, 5)]
    assert sim.workload(WEB).replicas == 5
    assert (
        await bus.queued(
            events.SCALE_COMMAND.at(namespace=NS, kind="Deployment", name="web"),
            stream=executor_service.SCALE_STREAM,
        )
        == 1
    )  # a limits stream keeps what was acked; the durable consumer moved past it


async def test_a_transient_failure_is_retried_after_its_delay_in_clock_time(
    broker: MemoryBroker, bus: MemoryBus, clock: ManualClock
) -> None:
    port = Flaky(cluster(), failures=1)
    results: list[events.ScaleResult] = []
    collecting = await collect(bus, events.SCALE_RESULT.filter(), results)
    body = functools.partial(executor_service.serve, settings(), clock=clock, cluster=port)
    async with running(broker, "executor", settings(), body):
        await publish(bus, scale_command(NS, desired=4))
        await eventually(lambda: port.reads == 1)
        await clock.advance(COMMAND_RETRY.delay(1) - 0.5)
        assert (port.reads, results) == (1, [])  # handed back, not due yet
        await clock.advance(1.0)
        await eventually(lambda: results)
    collecting.cancel()
    assert [(r.outcome, r.current) for r in results] == [("applied", 4)]
    assert port.reads == 2


async def test_a_command_that_keeps_failing_is_reported_failed_after_max_attempts(
    broker: MemoryBroker, bus: MemoryBus, clock: ManualClock
) -> None:
    port = Flaky(cluster(), failures=100)
    results: list[events.ScaleResult] = []
    collecting = await collect(bus, events.SCALE_RESULT.filter(), results)
    chosen = settings(max_attempts=3)
    body = functools.partial(executor_service.serve, chosen, clock=clock, cluster=port)
    async with running(broker, "executor", chosen, body):
        await publish(bus, scale_command(NS, desired=4))
        for attempt in (1, 2):
            await eventually(lambda attempt=attempt: port.reads == attempt)  # type: ignore[misc]
            await clock.advance(COMMAND_RETRY.delay(attempt))
        await eventually(lambda: results)
    collecting.cancel()
    assert [r.outcome for r in results] == ["failed"]
    assert "apiserver unreachable" in results[0].message
    assert port.reads == 3


async def test_observe_mode_writes_nothing_and_says_what_it_would_do(
    broker: MemoryBroker, bus: MemoryBus, clock: ManualClock
) -> None:
    sim = cluster()
    port = SimClusterPort(sim)
    results: list[events.ScaleResult] = []
    collecting = await collect(bus, events.SCALE_RESULT.filter(), results)
    chosen = settings(mode="observe")
    body = functools.partial(executor_service.serve, chosen, clock=clock, cluster=port)
    async with running(broker, "executor", chosen, body):
        await publish(bus, scale_command(NS, desired=6))
        await eventually(lambda: results)
    collecting.cancel()
    assert [(r.outcome, r.current, r.dry_run) for r in results] == [("would_scale", 6, True)]
    assert sim.workload(WEB).replicas == 2
    assert [reason for _, reason, _ in port.events] == ["TideshiftWouldScale"]
