"""The bus on a three-server NATS cluster (issue 29): every stream and bucket kept on three
servers, a replica count the server cannot hold refused in one line, and a client given the
cluster's URLs riding out the loss of the very server it talks to, which also leads the
scale-command stream."""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import nats.errors
import pytest
from pydantic import ValidationError

from tideshift import events
from tideshift.events.client import EventClient
from tideshift.services.common.bus import SCALE_STREAM, Bus
from tideshift.services.common.bus.connect import redact
from tideshift.services.common.bus.provision import stream_names
from tideshift.services.common.embedded_nats import EmbeddedNats, NatsCluster
from tideshift.services.common.settings import ServiceSettings

TIDESHIFT = str(Path(sys.executable).parent / "tideshift")
NOW = datetime(2026, 1, 1, tzinfo=UTC)
COMMANDS = 60
# Raft elects a new stream leader within a few seconds of losing one; far above that is a bug.
RECOVERY_BOUND_SECONDS = 20.0


@pytest.fixture(scope="module")
def cluster() -> Iterator[NatsCluster]:
    with NatsCluster(size=3, replicas=3) as running:
        yield running


def command(namespace: str, index: int) -> events.ScaleCommand:
    return events.ScaleCommand(
        target=events.WorkloadRef(kind="Deployment", namespace=namespace, name="web"),
        desired=index,
        reason="cluster test",
        plan_id=f"p{index}",
        issued_at=NOW,
        idempotency_key=f"{namespace}-{index}",
    )


def leader(cluster: NatsCluster, name: str) -> EmbeddedNats:
    return next(s for s in cluster.servers if f"tideshift-{s.port}" == name)


async def test_provisioning_keeps_every_stream_and_bucket_on_three_servers(
    cluster: NatsCluster,
) -> None:
    bus = await Bus.connect(cluster.url, name="cluster-check")
    try:
        for name in stream_names():
            info = await bus.js.stream_info(name)
            assert info.config.num_replicas == 3, name
            assert info.cluster is not None and len(info.cluster.replicas or []) == 2, name
    finally:
        await bus.close()


def test_more_replicas_than_servers_is_one_line_naming_the_setting() -> None:
    with EmbeddedNats(provision=False) as single:
        done = subprocess.run(
            [TIDESHIFT, "nats", "provision", "--nats-url", single.url, "--nats-replicas", "3"],
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert done.returncode == 1
    assert done.stderr.count("\n") == 1, done.stderr
    assert "--nats-replicas" in done.stderr and "JetStream servers" in done.stderr


def test_replicas_outside_one_to_five_are_refused() -> None:
    done = subprocess.run(
        [
            TIDESHIFT,
            "nats",
            "provision",
            "--nats-url",
            "nats://127.0.0.1:1",
            "--nats-replicas",
            "7",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    assert "--nats-replicas" in done.stderr and "from 1 to 5" in done.stderr
    with pytest.raises(ValidationError, match="nats_replicas"):
        ServiceSettings(nats_replicas=0)


async def publish_until_stored(bus: Bus, namespace: str, index: int) -> None:
    """Publish, retrying with the same message id until the stream acknowledges: a retry of
    one the stream stored before the ack was lost is dropped by its duplicate window."""
    subject = events.SCALE_COMMAND.at(namespace=namespace, kind="Deployment", name="web")
    while True:
        try:
            await bus.publish_durable(subject, command(namespace, index), msg_id=f"c{index}")
            return
        except (TimeoutError, nats.errors.Error):
            await asyncio.sleep(0.1)


async def test_a_client_rides_out_the_loss_of_its_server_and_the_stream_leader(
    cluster: NatsCluster, unique: str
) -> None:
    bus = await Bus.connect(cluster.url, name="cluster-rider", replicas=3)
    info = await bus.js.stream_info(SCALE_STREAM.name)
    assert info.cluster is not None and info.cluster.leader is not None
    victim = leader(cluster, info.cluster.leader)
    # The client picks a server of the list at random: reconnect until it talks to the
    # leader itself, so the leader's loss is this client's loss as well.
    for _ in range(30):
        assert bus.connection.connected_url is not None
        if bus.connection.connected_url.port == victim.port:
            break
        await bus.close()
        bus = await Bus.connect(cluster.url, name="cluster-rider", replicas=3)
    assert bus.connection.connected_url.port == victim.port
    received: dict[int, int] = {}
    all_received, half_received = asyncio.Event(), asyncio.Event()
    deliveries = bus.consume(
        events.SCALE_COMMAND.filter(namespace=unique),
        stream=SCALE_STREAM,
        durable=f"rider-{unique}",
        ack_wait_seconds=5.0,
    )

    async def consume() -> None:
        async for delivery in deliveries:
            desired = delivery.event.data.desired
            received[desired] = received.get(desired, 0) + 1
            if len(received) == COMMANDS // 2:
                half_received.set()
            if len(received) == COMMANDS:
                all_received.set()
            with contextlib.suppress(TimeoutError, nats.errors.Error):
                await delivery.ack()

    consumer = asyncio.create_task(consume())
    try:
        for index in range(COMMANDS // 2):
            await publish_until_stored(bus, unique, index)
        # Mid-run: the consumer exists and has taken half the commands.
        await asyncio.wait_for(half_received.wait(), RECOVERY_BOUND_SECONDS)
        killed_at = time.monotonic()
        victim.kill()
        await publish_until_stored(bus, unique, COMMANDS // 2)
        recovered = time.monotonic() - killed_at
        for index in range(COMMANDS // 2 + 1, COMMANDS):
            await publish_until_stored(bus, unique, index)
        await asyncio.wait_for(all_received.wait(), RECOVERY_BOUND_SECONDS)
        print(f"stream leader killed: publishing recovered in {recovered:.2f}s")
        assert recovered < RECOVERY_BOUND_SECONDS
        assert sorted(received) == list(range(COMMANDS))  # none lost
        after = await bus.js.stream_info(SCALE_STREAM.name)
        assert after.cluster is not None and after.cluster.leader != info.cluster.leader
        stored = await bus.queued(
            events.SCALE_COMMAND.at(namespace=unique, kind="Deployment", name="web"),
            stream=SCALE_STREAM,
        )
        assert stored == COMMANDS  # none stored twice
    finally:
        consumer.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await consumer
        await bus.close()


def test_a_server_list_is_shown_without_its_passwords() -> None:
    shown = redact("nats://planner:secret@a:4222, nats://b:4222")
    assert shown == "nats://planner:***@a:4222,nats://b:4222"


async def test_an_event_client_given_the_list_hears_an_event_published_on_another_server(
    cluster: NatsCluster, unique: str
) -> None:
    """Users' reaction clients take the same comma-separated list as the services."""
    async with await EventClient.connect(cluster.url) as client:
        assert client._connection.connected_url is not None
        elsewhere = next(
            s
            for s in cluster.servers
            if s.running and s.port != client._connection.connected_url.port
        )
        subject = events.SCALE_COMMAND.at(namespace=unique, kind="Deployment", name="web")
        heard = client.subscribe(events.SCALE_COMMAND.filter(namespace=unique))
        listening = asyncio.ensure_future(anext(heard))
        await client._connection.flush()
        publisher = await Bus.connect(elsewhere.url, name="cluster-publisher")
        try:
            await publisher.publish_durable(subject, command(unique, 7))
            envelope = await asyncio.wait_for(listening, 10)
        finally:
            await publisher.close()
            await heard.aclose()
    assert envelope.data.desired == 7
