"""Who creates what on the bus (issue 25), against a real nats-server with the generated
logins: only the `provisioner` creates streams and buckets (`tideshift nats provision`); a
service role cannot delete, purge or redefine a stream, nor create a bucket; a service that
starts before provisioning waits and says for what."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
import urllib.request
from collections.abc import AsyncGenerator, AsyncIterator, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import cast

import nats.errors
import nats.js.errors
import pytest

from tideshift import events
from tideshift.events.buckets import (
    PINS_BUCKET,
    RISE_HISTORY_BUCKET,
    TRAINER_CHECKPOINTS_BUCKET,
    TRAINER_JOBS_BUCKET,
    TRAINER_MEMBERS_BUCKET,
)
from tideshift.services.common.bus import SCALE_STREAM, Bus, Delivery
from tideshift.services.common.bus.permissions import ROLES
from tideshift.services.common.bus.provision import (
    NotProvisioned,
    missing,
    stream_names,
    wait_provisioned,
)
from tideshift.services.common.bus.streams import (
    BUCKETS,
    HISTORY_STREAM,
    STREAMS,
    TRAINER_MEMBER_TTL_SECONDS,
    TRAINING_TASK_STREAM,
    read_kept,
)
from tideshift.services.common.embedded_nats import EmbeddedNats
from tideshift.services.common.ports import free_port
from tideshift.services.planner.core import PolicyConfig
from tideshift.services.trainer.port.bus import MEMBER_TTL_SECONDS

TIDESHIFT = str(Path(sys.executable).parent / "tideshift")
SERVICE_ROLES = [name for name, role in ROLES.items() if role.jetstream and name != "provisioner"]


@pytest.fixture
def bare() -> Iterator[EmbeddedNats]:
    """Logins on, nothing provisioned yet."""
    with EmbeddedNats(auth=True, provision=False) as running:
        yield running


@pytest.fixture(scope="module")
def provisioned() -> Iterator[EmbeddedNats]:
    with EmbeddedNats(auth=True) as running:
        yield running


async def as_role(server: EmbeddedNats, role: str) -> Bus:
    return await Bus.connect(
        server.url, name=f"test-{role}", user=role, password=server.passwords[role]
    )


@pytest.fixture
async def admin(provisioned: EmbeddedNats) -> AsyncIterator[Bus]:
    bus = await as_role(provisioned, "provisioner")
    try:
        yield bus
    finally:
        await bus.close()


def login_env(server: EmbeddedNats, role: str) -> dict[str, str]:
    """A process's environment as the chart gives a pod: the URL and `role`'s login."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("TIDESHIFT_")}
    return env | {
        "TIDESHIFT_NATS_URL": server.url,
        "TIDESHIFT_NATS_USER": role,
        "TIDESHIFT_NATS_PASSWORD": server.passwords[role],
    }


def provision_command(server: EmbeddedNats, role: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [TIDESHIFT, "nats", "provision", "--timeout", "20"],
        env=login_env(server, role),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_the_provision_command_creates_every_stream_and_bucket_idempotently(
    bare: EmbeddedNats,
) -> None:
    first = provision_command(bare, "provisioner")
    assert first.returncode == 0, first.stderr
    assert f"provisioned {len(stream_names())} streams" in first.stdout
    again = provision_command(bare, "provisioner")
    assert again.returncode == 0, again.stderr

    async def check() -> list[str]:
        bus = await as_role(bare, "provisioner")
        try:
            members = await bus.js.stream_info(f"KV_{BUCKETS[5].name}")
            assert members.config.max_age == TRAINER_MEMBER_TTL_SECONDS
            return await missing(bus, stream_names())
        finally:
            await bus.close()

    assert asyncio.run(check()) == []


def test_a_service_role_cannot_provision(bare: EmbeddedNats) -> None:
    refused = provision_command(bare, "planner")
    assert refused.returncode == 1
    assert refused.stderr.strip().splitlines()[-1].startswith("tideshift nats provision: ")
    assert "Traceback" not in refused.stderr


async def test_a_service_role_cannot_create_a_bucket_and_the_log_says_who_does(
    bare: EmbeddedNats, caplog: pytest.LogCaptureFixture
) -> None:
    planner = await as_role(bare, "planner")
    try:
        with pytest.raises((nats.errors.TimeoutError, nats.js.errors.Error)):
            await planner.kv(PINS_BUCKET)
        assert await missing(planner, [f"KV_{PINS_BUCKET}"]) == [f"KV_{PINS_BUCKET}"]
    finally:
        await planner.close()
    refused = [r.getMessage() for r in caplog.records if "refused an operation" in r.getMessage()]
    assert refused and "tideshift nats provision" in refused[0]


async def test_a_service_waits_for_provisioning_then_goes_on(bare: EmbeddedNats) -> None:
    planner = await as_role(bare, "planner")
    try:
        with pytest.raises(NotProvisioned, match="tideshift nats provision"):
            await wait_provisioned(planner, timeout=0.5)
        waiting = asyncio.create_task(wait_provisioned(planner, timeout=60))
        await asyncio.sleep(0)  # it is waiting, not done
        assert not waiting.done()
        done = await asyncio.to_thread(provision_command, bare, "provisioner")
        assert done.returncode == 0, done.stderr
        await asyncio.wait_for(waiting, 30)
        assert await planner.kv(PINS_BUCKET) is not None
    finally:
        await planner.close()


@pytest.mark.parametrize("role", SERVICE_ROLES)
async def test_a_service_role_cannot_create_delete_purge_or_redefine_a_stream(
    provisioned: EmbeddedNats, admin: Bus, role: str
) -> None:
    before = (await admin.js.stream_info(SCALE_STREAM.name)).config
    bus = await as_role(provisioned, role)
    try:
        # A refused JetStream API request gets no answer: nats-py times out (soon, here).
        js = bus.connection.jetstream(timeout=1)
        with pytest.raises(nats.errors.TimeoutError):
            await js.delete_stream(SCALE_STREAM.name)
        with pytest.raises(nats.errors.TimeoutError):
            await js.purge_stream(SCALE_STREAM.name)
        widened = SCALE_STREAM.config()
        widened.max_msgs = 10
        with pytest.raises(nats.errors.TimeoutError):
            await js.update_stream(widened)
        # Creating is the provisioner's: refused even with the stream's own configuration.
        for config in (widened, SCALE_STREAM.config()):
            with pytest.raises(nats.errors.TimeoutError):
                await js.add_stream(config)
    finally:
        await bus.close()
    assert (await admin.js.stream_info(SCALE_STREAM.name)).config == before


def test_the_member_bucket_expires_keys_as_the_trainer_expects() -> None:
    assert TRAINER_MEMBER_TTL_SECONDS == MEMBER_TTL_SECONDS


async def test_the_rise_history_of_a_workload_that_is_gone_expires_with_the_rise_window(
    provisioned: EmbeddedNats,
) -> None:
    planner = await as_role(provisioned, "planner")
    try:
        info = await planner.js.stream_info(f"KV_{RISE_HISTORY_BUCKET}")
    finally:
        await planner.close()
    assert info.config.max_age == PolicyConfig().rise_window_s


async def test_only_the_executor_keeps_the_decision_history_stream(
    provisioned: EmbeddedNats,
) -> None:
    planner = await as_role(provisioned, "planner")
    try:
        with pytest.raises(nats.errors.TimeoutError):
            await planner.connection.jetstream(timeout=1).add_stream(HISTORY_STREAM.config())
    finally:
        await planner.close()
    executor = await as_role(provisioned, "executor")
    try:
        await executor.ensure_streams((HISTORY_STREAM,))
        info = await executor.js.stream_info(HISTORY_STREAM.name)
        assert info.config.max_msgs == HISTORY_STREAM.max_msgs
    finally:
        await executor.close()


async def test_the_operator_reads_the_decision_history_but_the_reaction_cannot(
    provisioned: EmbeddedNats,
) -> None:
    executor = await as_role(provisioned, "executor")
    operator = await as_role(provisioned, "operator")
    try:
        await executor.ensure_streams((HISTORY_STREAM,))
        target = events.WorkloadRef(kind="Deployment", namespace="history", name="web")
        command = events.ScaleCommand(
            target=target,
            desired=3,
            reason="test",
            plan_id="p1",
            issued_at=datetime.now(UTC),
            idempotency_key="history-k1",
            issuer="operator",
        )
        subject = events.SCALE_COMMAND.at(namespace="history", kind="Deployment", name="web")
        await operator.publish_durable(subject, command)

        async def copied() -> list[str]:
            # The history sources the scale stream on its own schedule: read until it has it.
            while True:
                read = [
                    s
                    async for s, _ in read_kept(
                        operator.js, HISTORY_STREAM, (subject.value,), since=None
                    )
                ]
                if read:
                    return read
                await asyncio.sleep(0.1)

        assert await asyncio.wait_for(copied(), 30) == [subject.value]
    finally:
        await operator.close()
        await executor.close()
    reaction = await as_role(provisioned, "reaction")
    try:
        with pytest.raises(nats.errors.TimeoutError):
            await reaction.connection.jetstream(timeout=1).stream_info(HISTORY_STREAM.name)
    finally:
        await reaction.close()


def test_a_service_login_waits_for_provisioning_saying_what_is_missing(
    bare: EmbeddedNats,
) -> None:
    """The chart's init container of each service: `tideshift nats provision --wait`."""
    waiting = subprocess.Popen(
        [TIDESHIFT, "nats", "provision", "--wait"],
        env=login_env(bare, "executor"),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert waiting.stderr is not None
        said = waiting.stderr.readline()
        assert "waiting for streams" in said and "tideshift nats provision" in said
        assert waiting.poll() is None
        assert provision_command(bare, "provisioner").returncode == 0
        out, _ = waiting.communicate(timeout=60)
        assert waiting.returncode == 0
        assert out.startswith(f"found {len(STREAMS)} streams")
    finally:
        if waiting.poll() is None:
            waiting.kill()
            waiting.wait()


async def test_the_training_roles_do_their_jobs_on_a_provisioned_bus(
    provisioned: EmbeddedNats,
) -> None:
    """The rights of trainers, coordinators and parameter servers, without any create."""
    job = f"job-{os.getpid()}"
    coordinator = await as_role(provisioned, "coordinator")
    trainer = await as_role(provisioned, "trainer")
    pserver = await as_role(provisioned, "pserver")
    try:
        lease = await coordinator.lease(f"coordinator-{job}", holder="c1", ttl_seconds=10)
        assert await lease.try_acquire()
        jobs = await coordinator.kv(TRAINER_JOBS_BUCKET)
        await jobs.raw.put(job, b"{}")
        task = events.ShardTask(job=job, epoch=0, shard=0, shards=1, issued_at=datetime.now(UTC))
        await coordinator.publish_durable(events.SHARD_TASK.at(job=job), task)

        members = await trainer.kv(TRAINER_MEMBERS_BUCKET, ttl_seconds=MEMBER_TTL_SECONDS)
        await members.raw.put(f"{job}.t1", b"{}")
        deliveries = cast(
            AsyncGenerator[Delivery[events.ShardTask]],
            trainer.consume(
                events.SHARD_TASK.at(job=job), stream=TRAINING_TASK_STREAM, durable=f"{job}-t"
            ),
        )
        delivery = await asyncio.wait_for(anext(deliveries), 30)
        await delivery.ack()
        await deliveries.aclose()
        assert delivery.event.data.shard == 0

        async def echo(payload: bytes) -> bytes:
            return payload[::-1]

        stop = await pserver.serve(f"tideshift.v1.training.pserver.{job}.0.push", echo)
        await pserver.flush()  # the server has the subscription before the request is sent
        reply = await trainer.request(f"tideshift.v1.training.pserver.{job}.0.push", b"abc")
        await stop()
        assert reply == b"cba"
        # a parameter server reads the job's spec and writes its progress record beside it
        pserver_jobs = await pserver.kv(TRAINER_JOBS_BUCKET)
        assert (await pserver_jobs.raw.get(job)).value == b"{}"
        await pserver_jobs.raw.put(f"{job}.progress-0", b"{}")
        await pserver.put_object(TRAINER_CHECKPOINTS_BUCKET, job, b"v1")
        await pserver.put_object(TRAINER_CHECKPOINTS_BUCKET, job, b"v2")  # purges v1's chunks
        assert await pserver.get_object(TRAINER_CHECKPOINTS_BUCKET, job) == b"v2"
    finally:
        for bus in (coordinator, trainer, pserver):
            await bus.close()


@pytest.mark.parametrize("role", SERVICE_ROLES)
async def test_a_service_role_cannot_create_a_missing_stream(bare: EmbeddedNats, role: str) -> None:
    bus = await as_role(bare, role)
    try:
        with pytest.raises(nats.errors.TimeoutError):
            await bus.connection.jetstream(timeout=1).add_stream(SCALE_STREAM.config())
        assert await missing(bus, [SCALE_STREAM.name]) == [SCALE_STREAM.name]
    finally:
        await bus.close()


def ready(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=2) as answer:
            return bool(answer.status == 200)
    except OSError:
        return False


def test_a_service_started_first_waits_for_provisioning_then_serves(bare: EmbeddedNats) -> None:
    """A service names the missing streams and who creates them, is not ready meanwhile, and
    goes on once the provisioner has run (it never creates a stream itself)."""
    port = free_port()
    service = subprocess.Popen(
        [TIDESHIFT, "run", "predictor", "--health-port", str(port)],
        env=login_env(bare, "predictor"),
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert service.stderr is not None
        lines = iter(service.stderr.readline, "")
        said = next(line for line in lines if "waiting for streams" in line)
        assert SCALE_STREAM.name in said and "tideshift nats provision" in said
        assert service.poll() is None and not ready(port)
        assert provision_command(bare, "provisioner").returncode == 0
        deadline = time.monotonic() + 60
        while not ready(port):
            assert service.poll() is None and time.monotonic() < deadline
            time.sleep(0.2)
    finally:
        service.terminate()
        service.wait(timeout=30)
    assert service.returncode == 0


def test_on_a_server_without_logins_a_service_creates_the_streams_itself() -> None:
    """No provisioner exists there (the chart runs its Job with logins only): as before."""
    port = free_port()
    with EmbeddedNats(provision=False) as open_server:
        env = {k: v for k, v in os.environ.items() if not k.startswith("TIDESHIFT_")}
        service = subprocess.Popen(
            [TIDESHIFT, "run", "predictor", "--health-port", str(port)],
            env=env | {"TIDESHIFT_NATS_URL": open_server.url},
            stderr=subprocess.DEVNULL,
        )
        try:
            deadline = time.monotonic() + 60
            while not ready(port):
                assert service.poll() is None and time.monotonic() < deadline
                time.sleep(0.2)
        finally:
            service.terminate()
            service.wait(timeout=30)

        async def absent() -> list[str]:
            bus = await Bus.connect(open_server.url, name="test-open")
            try:
                return await missing(bus, [spec.name for spec in STREAMS])
            finally:
                await bus.close()

        assert asyncio.run(absent()) == []
    assert service.returncode == 0
