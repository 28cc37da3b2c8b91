"""An authenticated, least-privilege bus (issue 25) against a real nats-server run with the
permissions `permissions.ROLES` generates: anonymous and reaction clients cannot order a
scale, over NATS or MQTT; a wrong password fails at once, without showing it; each role can
do its job."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from collections.abc import AsyncGenerator, AsyncIterator, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import cast

import aiomqtt
import nats
import nats.errors
import pytest

from tideshift import events
from tideshift.events.buckets import EXECUTOR_RECORDS_BUCKET, RISE_HISTORY_BUCKET, SNAPSHOT_BUCKET
from tideshift.events.client import EventClient
from tideshift.services.common.bus import SCALE_STREAM, Bus, Delivery, NatsAuthError
from tideshift.services.common.bus.permissions import EXECUTOR_DURABLE, ROLES, markdown_table
from tideshift.services.common.bus.provision import check_provisioned
from tideshift.services.common.embedded_nats import EmbeddedNats

WAIT = 10.0
NOW = datetime(2026, 1, 1, tzinfo=UTC)


@pytest.fixture(scope="module")
def server() -> Iterator[EmbeddedNats]:
    with EmbeddedNats(auth=True) as running:
        yield running


async def as_role(server: EmbeddedNats, role: str) -> Bus:
    return await Bus.connect(
        server.url, name=f"test-{role}", user=role, password=server.passwords[role]
    )


@pytest.fixture
async def planner(server: EmbeddedNats) -> AsyncIterator[Bus]:
    bus = await as_role(server, "planner")
    try:
        yield bus
    finally:
        await bus.close()


def command(namespace: str) -> events.ScaleCommand:
    return events.ScaleCommand(
        target=events.WorkloadRef(kind="Deployment", namespace=namespace, name="web"),
        desired=0,
        reason="test",
        plan_id="p1",
        issued_at=NOW,
        idempotency_key=f"k-{namespace}",
    )


def command_subject(namespace: str) -> events.BoundSubject[events.ScaleCommand]:
    return events.SCALE_COMMAND.at(namespace=namespace, kind="Deployment", name="web")


async def stored(bus: Bus, namespace: str) -> int:
    return await bus.queued(command_subject(namespace), stream=SCALE_STREAM)


async def test_an_anonymous_client_is_refused_at_once(server: EmbeddedNats) -> None:
    # The timeout is long: a refusal that waited for it would be a plain ConnectionError.
    with pytest.raises(NatsAuthError, match="refused an anonymous client"):
        await Bus.connect(server.url, name="anonymous", connect_timeout=60)


async def test_a_wrong_password_is_refused_at_once_and_never_shown(server: EmbeddedNats) -> None:
    secret = "wrong-but-secret-3f9a"
    with pytest.raises(NatsAuthError, match="refused user 'planner'") as refused:
        await Bus.connect(server.url, name="w", user="planner", password=secret, connect_timeout=60)
    url = server.url.replace("nats://", f"nats://planner:{secret}@")
    with pytest.raises(NatsAuthError) as refused_by_url:
        await Bus.connect(url, name="w", connect_timeout=60)
    for error in (refused.value, refused_by_url.value):
        assert secret not in str(error)
    assert "planner:***@" in str(refused_by_url.value)


async def test_a_reaction_clients_scale_command_is_refused_and_not_stored(
    server: EmbeddedNats, planner: Bus, unique: str
) -> None:
    errors: list[str] = []

    async def on_error(error: Exception) -> None:
        errors.append(str(error))

    reaction = await nats.connect(
        server.url,
        user="reaction",
        password=server.passwords["reaction"],
        error_cb=on_error,
        allow_reconnect=False,
    )
    try:
        await reaction.publish(command_subject(unique).value, b'{"desired": 0}')
        await reaction.flush()  # the server has handled the publish when the PONG comes back
        assert await stored(planner, unique) == 0
        assert any("permissions violation for publish" in e for e in errors), errors
    finally:
        await reaction.close()
    await planner.publish_durable(command_subject(unique), command(unique))
    assert await stored(planner, unique) == 1, "the planner's own command is stored"


async def test_an_mqtt_reaction_client_reads_events_and_its_command_is_dropped(
    server: EmbeddedNats, planner: Bus, unique: str
) -> None:
    async with aiomqtt.Client(
        "127.0.0.1",
        server.mqtt_port,
        username="reaction",
        password=server.passwords["reaction"],
        identifier=f"react-{unique}",
    ) as client:
        await client.subscribe(f"tideshift/v1/plan/decided/{unique}", qos=1)
        topic = f"tideshift/v1/scale/command/{unique}/Deployment/web"
        await client.publish(topic, b'{"desired": 0}', qos=1)  # PUBACKed, yet dropped
        # A message published after it reaches the client: the command was handled by then.
        await planner.connection.publish(f"tideshift.v1.plan.decided.{unique}", b"marker")
        message = await asyncio.wait_for(anext(client.messages), WAIT)
        assert message.payload == b"marker"
    assert await stored(planner, unique) == 0


async def test_a_reaction_client_cannot_log_in_over_mqtt_with_a_wrong_password(
    server: EmbeddedNats,
) -> None:
    with pytest.raises(aiomqtt.MqttError):
        async with aiomqtt.Client(
            "127.0.0.1", server.mqtt_port, username="reaction", password="nope", timeout=5
        ):
            pass


async def test_the_executor_may_not_publish_commands_but_consumes_and_reports(
    server: EmbeddedNats, planner: Bus, unique: str
) -> None:
    executor = await as_role(server, "executor")
    try:
        with pytest.raises(nats.errors.TimeoutError):
            await executor.js.publish(command_subject(unique).value, b"{}", timeout=2)
        await planner.publish_durable(command_subject(unique), command(unique))
        # `consume` is an async generator: typed as one, so it can be closed here.
        deliveries = cast(
            AsyncGenerator[Delivery[events.ScaleCommand]],
            executor.consume(
                command_subject(unique), stream=SCALE_STREAM, durable=EXECUTOR_DURABLE
            ),
        )
        delivery = await asyncio.wait_for(anext(deliveries), WAIT)
        await delivery.ack()
        await deliveries.aclose()
        assert delivery.event.data.idempotency_key == f"k-{unique}"
        records = await executor.kv(EXECUTOR_RECORDS_BUCKET)
        await records.raw.put(unique, b"applied")
        result = events.ScaleResult(
            target=delivery.event.data.target,
            idempotency_key=delivery.event.data.idempotency_key,
            outcome="applied",
            desired=0,
            previous=1,
            executed_at=NOW,
        )
        at = events.SCALE_RESULT.at(namespace=unique, kind="Deployment", name="web")
        assert await executor.publish_durable(at, result) > 0
    finally:
        await executor.close()


async def test_the_watcher_publishes_the_cluster_and_not_commands(
    server: EmbeddedNats, unique: str
) -> None:
    watcher = await as_role(server, "watcher")
    try:
        snapshot = await watcher.kv(SNAPSHOT_BUCKET)
        await snapshot.raw.put(f"pod.{unique}", b"{}")
        with pytest.raises(nats.errors.TimeoutError):
            await watcher.js.publish(command_subject(unique).value, b"{}", timeout=2)
    finally:
        await watcher.close()


async def test_the_planner_follows_jobs_progress_and_keeps_the_rise_history(
    server: EmbeddedNats, planner: Bus, unique: str
) -> None:
    coordinator = await as_role(server, "coordinator")
    try:
        reports = planner.subscribe(events.JOB_PROGRESS.filter(), consumer=unique)
        first = asyncio.ensure_future(anext(reports))
        await planner.flush()
        progress = events.JobProgress(
            job=unique,
            state="running",
            epoch=0,
            epochs=2,
            shards=10,
            applied_in_epoch=3,
            applied_total=3,
            in_flight=0,
            redelivered=0,
            trainers=2,
            at=NOW,
        )
        await coordinator.publish(events.JOB_PROGRESS.at(job=unique), progress)
        assert (await asyncio.wait_for(first, WAIT)).data.job == unique
        await reports.aclose()
        history = await planner.kv(RISE_HISTORY_BUCKET)
        await history.raw.put(unique, b"{}")
        assert (await history.raw.get(unique)).value == b"{}"
    finally:
        await coordinator.close()


def test_a_service_started_with_a_wrong_password_exits_at_once_with_a_clear_line(
    server: EmbeddedNats,
) -> None:
    secret = "not-the-password-7c1e"
    env = {
        **os.environ,
        "TIDESHIFT_NATS_URL": server.url,
        "TIDESHIFT_NATS_USER": "predictor",
        "TIDESHIFT_NATS_PASSWORD": secret,
    }
    done = subprocess.run(
        [str(Path(sys.executable).parent / "tideshift"), "run", "predictor", "--health-port", "-1"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 1, done.stderr
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("tideshift predictor: NATS at"), done.stderr
    assert "refused user 'predictor'" in last
    assert "Traceback" not in done.stderr
    assert secret not in done.stderr + done.stdout


def test_the_permission_table_names_who_may_order_a_scale() -> None:
    command_pattern = events.SCALE_COMMAND.filter().value
    may_command = {name for name, role in ROLES.items() if command_pattern in role.publish}
    assert may_command == {"planner", "operator"}
    may_report = {
        name for name, role in ROLES.items() if events.SCALE_RESULT.filter().value in role.publish
    }
    assert may_report == {"executor"}
    assert ROLES["reaction"].publish == ()
    assert "| `reaction` |" in markdown_table()


async def test_a_client_takes_its_login_from_the_environment_as_the_chart_gives_it(
    server: EmbeddedNats, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    password_file = tmp_path / "password"
    password_file.write_text(server.passwords["trainer"] + "\n")
    monkeypatch.setenv("TIDESHIFT_NATS_USER", "trainer")
    monkeypatch.setenv("TIDESHIFT_NATS_PASSWORD_FILE", str(password_file))
    bus = await Bus.connect(server.url, name="sdk-like", connect_timeout=60)
    try:
        await check_provisioned(bus)
    finally:
        await bus.close()
    password_file.write_text("stale")
    with pytest.raises(NatsAuthError, match="refused user 'trainer'"):
        await Bus.connect(server.url, name="sdk-like", connect_timeout=60)


async def test_a_users_event_client_logs_in_as_the_reaction_from_the_environment(
    server: EmbeddedNats, monkeypatch: pytest.MonkeyPatch
) -> None:
    with pytest.raises(ConnectionError):
        await EventClient.connect(server.url, timeout=2)
    monkeypatch.setenv("TIDESHIFT_NATS_USER", "reaction")
    monkeypatch.setenv("TIDESHIFT_NATS_PASSWORD", server.passwords["reaction"])
    client = await EventClient.connect(server.url, timeout=10)
    await client.close()
