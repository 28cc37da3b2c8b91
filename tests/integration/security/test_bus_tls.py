"""TLS on the bus (issue 25), against a real nats-server serving certificates made here: a
service or a reaction client (`EventClient`, `tideshift events tail`) trusts the server
through TIDESHIFT_NATS_TLS_CA_FILE; a client without that CA, or without the client
certificate a mutual-TLS server asks for, fails at once with one line naming the setting to
fix; MQTT reaction clients connect over TLS too."""

from __future__ import annotations

import asyncio
import json
import os
import ssl
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import aiomqtt
import pytest

from tideshift import events
from tideshift.events.client import EventClient
from tideshift.services.common.bus import Bus
from tideshift.services.common.bus.connect import (
    TLS_CA_VARIABLE,
    TLS_CERT_VARIABLE,
    TLS_KEY_VARIABLE,
    NatsTlsError,
)
from tideshift.services.common.embedded_nats import EmbeddedNats
from tideshift.services.devcluster.pki import CertificateAuthority

WAIT = 20.0
TIDESHIFT = str(Path(sys.executable).parent / "tideshift")


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    directory = tmp_path_factory.mktemp("pki")
    authority = CertificateAuthority("tideshift-test-nats-ca")
    ca, _ = authority.pair.write(directory, "ca")
    cert, key = authority.issue_server("nats", dns_names=["localhost"], ips=["127.0.0.1"]).write(
        directory, "server"
    )
    client_cert, client_key = authority.issue_client("planner").write(directory, "client")
    stranger, _ = CertificateAuthority("someone-else").pair.write(directory, "stranger")
    return {
        "ca": ca,
        "cert": cert,
        "key": key,
        "client_cert": client_cert,
        "client_key": client_key,
        "stranger": stranger,
    }


@pytest.fixture(scope="module")
def server(pki: dict[str, Path]) -> Iterator[EmbeddedNats]:
    with EmbeddedNats(auth=True, tls_cert=pki["cert"], tls_key=pki["key"]) as running:
        yield running


@pytest.fixture(scope="module")
def mutual(pki: dict[str, Path]) -> Iterator[EmbeddedNats]:
    with EmbeddedNats(
        auth=True, tls_cert=pki["cert"], tls_key=pki["key"], tls_ca=pki["ca"]
    ) as running:
        yield running


@pytest.fixture(autouse=True)
def no_tls_from_the_outside(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in (TLS_CA_VARIABLE, TLS_CERT_VARIABLE, TLS_KEY_VARIABLE):
        monkeypatch.delenv(name, raising=False)


async def connect(server: EmbeddedNats, role: str = "planner", timeout: float = 60) -> Bus:
    # The long timeout: a failure that waited for it would not be "at once".
    return await Bus.connect(
        server.url,
        name=f"test-{role}",
        user=role,
        password=server.passwords[role],
        connect_timeout=timeout,
    )


def connections(server: EmbeddedNats) -> list[dict[str, Any]]:
    with urllib.request.urlopen(f"{server.monitor_url}/connz", timeout=5) as answer:
        found: list[dict[str, Any]] = json.load(answer).get("connections") or []
        return found


async def test_a_client_with_the_ca_connects_over_tls_and_uses_the_bus(
    server: EmbeddedNats, pki: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(TLS_CA_VARIABLE, str(pki["ca"]))
    bus = await connect(server)
    try:
        assert server.url.startswith("tls://")
        mine = [c for c in connections(server) if c.get("name") == "test-planner"]
        assert mine and mine[0].get("tls_version"), mine
        # The streams exist: the embedded server provisioned them before turning TLS on.
        assert (await bus.js.stream_info("TIDESHIFT_SCALE")).config.name == "TIDESHIFT_SCALE"
    finally:
        await bus.close()


async def test_a_client_without_the_ca_fails_at_once_naming_the_setting(
    server: EmbeddedNats,
) -> None:
    started = time.monotonic()
    with pytest.raises(NatsTlsError) as refused:
        await connect(server)
    assert time.monotonic() - started < WAIT
    message = str(refused.value)
    assert TLS_CA_VARIABLE in message and "certificate verify failed" in message
    assert "\n" not in message


async def test_a_ca_that_did_not_sign_the_server_is_refused_the_same_way(
    server: EmbeddedNats, pki: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(TLS_CA_VARIABLE, str(pki["stranger"]))
    with pytest.raises(NatsTlsError, match=TLS_CA_VARIABLE):
        await connect(server)


async def test_an_unreadable_ca_file_is_one_line_naming_the_variable(
    server: EmbeddedNats, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(TLS_CA_VARIABLE, str(tmp_path / "missing.pem"))
    with pytest.raises(NatsTlsError, match=f"^{TLS_CA_VARIABLE}: expected readable PEM"):
        await connect(server)


async def test_a_certificate_without_its_key_is_refused_before_connecting(
    server: EmbeddedNats, pki: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(TLS_CERT_VARIABLE, str(pki["client_cert"]))
    with pytest.raises(NatsTlsError, match=f"^{TLS_KEY_VARIABLE}: expected a PEM file"):
        await connect(server)


async def test_mutual_tls_needs_the_client_certificate(
    mutual: EmbeddedNats, pki: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(TLS_CA_VARIABLE, str(pki["ca"]))
    with pytest.raises(NatsTlsError) as refused:
        await connect(mutual)
    assert TLS_CERT_VARIABLE in str(refused.value) and TLS_KEY_VARIABLE in str(refused.value)
    monkeypatch.setenv(TLS_CERT_VARIABLE, str(pki["client_cert"]))
    monkeypatch.setenv(TLS_KEY_VARIABLE, str(pki["client_key"]))
    bus = await connect(mutual)
    try:
        assert bus.connected
    finally:
        await bus.close()


def service_env(server: EmbeddedNats, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TIDESHIFT_")}
    return env | {
        "TIDESHIFT_NATS_URL": server.url,
        "TIDESHIFT_NATS_USER": "predictor",
        "TIDESHIFT_NATS_PASSWORD": server.passwords["predictor"],
        "TIDESHIFT_HEALTH_PORT": "-1",
        **extra,
    }


def test_a_service_process_connects_over_tls_with_the_ca(
    server: EmbeddedNats, pki: dict[str, Path]
) -> None:
    process = subprocess.Popen(
        [TIDESHIFT, "run", "predictor", "--instance", "tls-check"],
        env=service_env(server, **{TLS_CA_VARIABLE: str(pki["ca"])}),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        deadline = time.monotonic() + WAIT
        mine: list[dict[str, Any]] = []
        while not mine and time.monotonic() < deadline and process.poll() is None:
            mine = [c for c in connections(server) if "tls-check" in c.get("name", "")]
            time.sleep(0.1)
        assert mine, f"the predictor never connected: {process.poll()=}"
        assert mine[0].get("tls_version")
    finally:
        process.terminate()
        process.wait(WAIT)


def test_a_service_process_without_the_ca_exits_at_once_with_one_line(
    server: EmbeddedNats,
) -> None:
    done = subprocess.run(
        [TIDESHIFT, "run", "predictor"],
        env=service_env(server),
        capture_output=True,
        text=True,
        timeout=WAIT,
        check=False,
    )
    assert done.returncode == 1
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("tideshift predictor: NATS at tls://") and TLS_CA_VARIABLE in last
    assert "Traceback" not in done.stderr


async def test_an_mqtt_reaction_client_connects_over_tls(
    server: EmbeddedNats, pki: dict[str, Path]
) -> None:
    context = ssl.create_default_context(cafile=str(pki["ca"]))
    async with aiomqtt.Client(
        "127.0.0.1",
        server.mqtt_port,
        username="reaction",
        password=server.passwords["reaction"],
        tls_context=context,
    ) as client:
        await client.subscribe("tideshift/v1/#")
    plain = ssl.create_default_context()  # the system's CAs: not ours
    with pytest.raises(aiomqtt.MqttError):
        async with aiomqtt.Client(
            "127.0.0.1",
            server.mqtt_port,
            username="reaction",
            password=server.passwords["reaction"],
            tls_context=plain,
        ):
            pass


async def event_client(server: EmbeddedNats) -> EventClient:
    # The long timeout: a TLS failure that waited for it would not be "at once".
    return await EventClient.connect(
        server.url, user="reaction", password=server.passwords["reaction"], timeout=60
    )


def plan(unique: str) -> tuple[events.BoundSubject[events.PlanDecided], events.PlanDecided]:
    decided = events.PlanDecided(plan_id=unique, policy=unique, decided_at=datetime.now(UTC))
    return events.PLAN_DECIDED.at(policy=unique), decided


async def test_a_reaction_client_trusts_a_private_ca_from_the_environment(
    server: EmbeddedNats, pki: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    with pytest.raises(ConnectionError) as refused:
        await asyncio.wait_for(event_client(server), 30)
    assert "certificate verify failed" in str(refused.value)
    assert TLS_CA_VARIABLE in str(refused.value)
    monkeypatch.setenv(TLS_CA_VARIABLE, str(pki["ca"]))
    planner = await connect(server)
    client = await event_client(server)
    try:
        subject, decided = plan("tls-reaction")
        events_ = client.subscribe(subject)
        # Core NATS keeps nothing: publish until the subscription (made on first read) sees it.
        received = asyncio.ensure_future(anext(events_))
        while not received.done():
            await planner.publish(subject, decided)
            await asyncio.wait({received}, timeout=0.2)
        assert received.result().data.plan_id == "tls-reaction"
        await events_.aclose()
    finally:
        await client.close()
        await planner.close()


async def test_a_reaction_client_presents_its_certificate_for_mutual_tls(
    mutual: EmbeddedNats, pki: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(TLS_CA_VARIABLE, str(pki["ca"]))
    with pytest.raises(ConnectionError) as refused:
        await asyncio.wait_for(event_client(mutual), 30)
    assert TLS_CERT_VARIABLE in str(refused.value) and TLS_KEY_VARIABLE in str(refused.value)
    monkeypatch.setenv(TLS_CERT_VARIABLE, str(pki["client_cert"]))
    with pytest.raises(ConnectionError, match=f"^{TLS_KEY_VARIABLE}: expected a PEM file"):
        await event_client(mutual)
    monkeypatch.setenv(TLS_KEY_VARIABLE, str(pki["client_key"]))
    client = await event_client(mutual)
    try:
        mine = [c for c in connections(mutual) if c.get("name") == "tideshift-events-client"]
        assert mine and mine[0].get("tls_version")
    finally:
        await client.close()


def tail_env(server: EmbeddedNats, **tls: Path) -> dict[str, str]:
    """A reaction's environment: its login, and the TLS variables given."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("TIDESHIFT_")}
    env |= {
        "TIDESHIFT_NATS_USER": "reaction",
        "TIDESHIFT_NATS_PASSWORD": server.passwords["reaction"],
    }
    return env | {name: str(path) for name, path in tls.items()}


def tail_one_plan(
    server: EmbeddedNats, unique: str, arguments: list[str], env: dict[str, str]
) -> subprocess.CompletedProcess[str]:
    """`tideshift events tail ... --count 1` while a planner publishes a plan until it exits."""
    subject, decided = plan(unique)
    tail = subprocess.Popen(
        [TIDESHIFT, "events", "tail", subject.value, "--count", "1", *arguments],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )

    async def publish_until_tail_exits() -> None:
        planner = await connect(server)
        try:
            deadline = time.monotonic() + 60
            while tail.poll() is None and time.monotonic() < deadline:
                await planner.publish(subject, decided)
                await asyncio.sleep(0.2)  # a tail exits after its one event: poll for that
        finally:
            await planner.close()

    try:
        asyncio.run(publish_until_tail_exits())
        out, err = tail.communicate(timeout=WAIT)
    finally:
        if tail.poll() is None:
            tail.kill()
            tail.wait()
    return subprocess.CompletedProcess(tail.args, tail.returncode, out, err)


def test_events_tail_reads_over_tls_with_the_ca_from_the_environment(
    server: EmbeddedNats, pki: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(TLS_CA_VARIABLE, str(pki["ca"]))  # the publishing planner's
    env = tail_env(server, **{TLS_CA_VARIABLE: pki["ca"]})
    done = tail_one_plan(server, "tls-tail", ["--nats-url", server.url], env)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.splitlines()[0])["data"]["plan_id"] == "tls-tail"
    mqtt = ["--mqtt", "--mqtt-url", f"mqtt://127.0.0.1:{server.mqtt_port}"]
    done = tail_one_plan(server, "tls-tail-mqtt", mqtt, env)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.splitlines()[0])["data"]["plan_id"] == "tls-tail-mqtt"


def test_events_tail_without_the_ca_says_what_to_set_in_one_line(server: EmbeddedNats) -> None:
    done = subprocess.run(
        [TIDESHIFT, "events", "tail", "--count", "1", "--nats-url", server.url],
        env=tail_env(server),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 1
    (line,) = done.stderr.strip().splitlines()
    assert "TLS handshake failed" in line and TLS_CA_VARIABLE in line
    assert "Start a server" not in line, "a running server that TLS refused needs no new server"
