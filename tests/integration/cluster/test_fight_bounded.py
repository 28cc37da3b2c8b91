"""A hostile second writer against two executors on a real nats-server: it resets a target's
replicas every 4 s for five minutes (virtual: a clock 25 times faster than the wall's, so the
run takes 12 s), while a planner stand-in asks for 10 replicas every 2 s. Tideshift's writes
stay within `write_bound` (the policy's: 3 overrides in 10 minutes make a fight; a held target
is written again after 60 s without the other writer's changes), the fight is reported (a
TideshiftFight Warning Event, held results), and `tideshift scale --resume` ends a hold at once.
"""

from __future__ import annotations

import asyncio
import time
from datetime import UTC, datetime
from typing import Any

import pytest

from tests.fixtures.support import eventually
from tests.integration.cluster.tasks import collect, running
from tideshift.events import SCALE_COMMAND, SCALE_RESULT, ScaleCommand, WorkloadRef
from tideshift.services.cluster.port import Node, Resources, ScaleState
from tideshift.services.cluster.sim import SimCluster, SimClusterPort, SimWorkload
from tideshift.services.common.bus import Bus
from tideshift.services.executor.core.fight import FightPolicy, write_bound
from tideshift.services.executor.executor import (
    FIGHT_REASON,
    HELD_PREFIX,
    RESUMED_REASON,
    Executor,
    KVFightStore,
    RecordStore,
)
from tideshift.services.executor.scale_cli import resume
from tideshift.services.executor.service import consume

pytestmark = pytest.mark.slow

SPEED = 25.0  # virtual seconds per wall second
FIGHT_S = 300.0  # the hostile writer's run, virtual
RESET_EVERY_S = 4.0
COMMAND_EVERY_S = 2.0
POLICY = FightPolicy(max_overrides=3, window_s=600.0, quiet_s=60.0)
WAIT = 30.0


class FastClock:
    """Unix seconds running SPEED times faster than the wall's."""

    def __init__(self) -> None:
        self.start = time.time()
        self.began = time.monotonic()

    def now(self) -> float:
        return self.start + (time.monotonic() - self.began) * SPEED

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(max(0.0, seconds) / SPEED)


class CountingPort(SimClusterPort):
    """The simulated cluster's port, counting Tideshift's writes."""

    writes = 0

    async def set_scale(self, target: WorkloadRef, replicas: int) -> ScaleState:
        self.writes += 1
        return await super().set_scale(target, replicas)


def make_cluster(ref: WorkloadRef) -> SimCluster:
    cluster = SimCluster(now=0.0)
    cluster.add_node(Node("n1", Resources(cpu=64, memory=256 * 2**30)))
    cluster.add_workload(
        SimWorkload(
            ref=ref, kind="Deployment", role="serving", pod_requests=Resources(cpu=0.1), replicas=4
        )
    )
    return cluster


def command(ref: WorkloadRef, n: int, clock: FastClock) -> ScaleCommand:
    return ScaleCommand(
        target=ref,
        desired=10,
        reason="forecast wants 10",
        plan_id=f"p{n}",
        issued_at=datetime.fromtimestamp(clock.now(), UTC),
        idempotency_key=f"fight-{n}",
    )


async def executors(
    buses: list[Bus], port: SimClusterPort, bucket: str, clock: FastClock
) -> list[Executor]:
    made = []
    for index, bus in enumerate(buses):
        kv = await bus.kv(bucket)
        made.append(
            Executor(
                port,
                RecordStore(kv),
                name=f"e{index}",
                clock=clock,
                events=port,
                fights=KVFightStore(kv),
                fight_policy=POLICY,
            )
        )
    return made


async def test_a_hostile_writer_for_five_minutes_gets_bounded_writes_and_a_reported_fight(
    bus: Bus, nats_server: Any, unique: str
) -> None:
    namespace = f"fight-{unique}"
    ref = WorkloadRef(namespace, "Deployment.apps", "web")
    cluster, clock = make_cluster(ref), FastClock()
    port = CountingPort(cluster)
    second = await Bus.connect(nats_server.url, name="second-executor")
    results: list[Any] = []
    subject = SCALE_COMMAND.filter(namespace=namespace)
    pair = await executors([bus, second], port, f"fight_{unique}", clock)
    resets = 0
    try:
        async with running(
            collect(bus.subscribe(SCALE_RESULT.filter(namespace=namespace), consumer="t"), results),
            *(
                consume(made, b, durable=f"fight-{unique}", subject=subject, clock=clock)
                for made, b in zip(pair, [bus, second], strict=True)
            ),
        ):
            await asyncio.sleep(0.05)
            began, sent, next_reset = clock.now(), 0, clock.now()
            while clock.now() - began < FIGHT_S:
                if clock.now() >= next_reset:
                    cluster.scale(ref, 4)  # the hostile writer, e.g. GitOps resetting it
                    resets += 1
                    next_reset += RESET_EVERY_S
                await bus.publish_durable(
                    SCALE_COMMAND.at(namespace=namespace, kind=ref.kind, name=ref.name),
                    command(ref, sent, clock),
                )
                sent += 1
                await clock.sleep(COMMAND_EVERY_S)
            await eventually(
                lambda: len(results) >= sent, WAIT, message="a result for every command"
            )
    finally:
        await second.close()
    fought_s = clock.now() - began
    bound = write_bound(POLICY, fought_s)
    told = [(reason, message) for target, reason, message in port.events if target == ref]
    fights = [message for reason, message in told if reason == FIGHT_REASON]
    held = [result for result in results if result.message.startswith(HELD_PREFIX)]
    print(
        f"fight of {fought_s:.0f} virtual s: {resets} hostile resets, {sent} commands, "
        f"{port.writes} Tideshift writes (bound {bound}), {len(fights)} fights, "
        f"{len(held)} held results"
    )
    assert len(results) == sent, "every command answered"
    assert 0 < port.writes <= bound
    assert len(fights) >= 2, "a fight, then a resume and a second fight"
    assert any(reason == RESUMED_REASON for reason, _ in told)
    assert held and all(result.outcome == "rejected" for result in held)


async def test_an_operator_resume_ends_the_hold_at_once(bus: Bus, unique: str) -> None:
    namespace = f"fight-{unique}"
    ref = WorkloadRef(namespace, "Deployment.apps", "web")
    cluster, clock = make_cluster(ref), FastClock()
    port = CountingPort(cluster)
    bucket = f"fightr_{unique}"
    (made,) = await executors([bus], port, bucket, clock)
    made.fight_policy = FightPolicy(max_overrides=2, window_s=600.0, quiet_s=3600.0)
    outcomes = []
    for n in range(4):
        outcomes.append((await made.handle(command(ref, n, clock))).outcome)
        cluster.scale(ref, 4)
    assert outcomes == ["applied", "applied", "rejected", "rejected"]
    await resume(bus, ref, bucket=bucket)
    assert (await made.handle(command(ref, 10, clock))).outcome == "applied"
    assert port.writes == 3
