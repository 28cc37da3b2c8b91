"""`tideshift nats`, `tideshift events tail|schema` and the service runtime, as processes."""

from __future__ import annotations

import asyncio
import importlib.metadata
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
import urllib.request
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest

from tests.fixtures.support import until
from tideshift import events
from tideshift.services.common.bus import Bus
from tideshift.services.common.embedded_nats import EmbeddedNats
from tideshift.services.common.ports import free_port

TIDESHIFT = [sys.executable, "-m", "tideshift.services.cli"]
REPO = Path(__file__).resolve().parents[3]


def spawn(*args: str, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [*TIDESHIFT, *args],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, **(env or {})},
    )


@pytest.fixture
def stopped_at_end() -> Iterator[list[subprocess.Popen[str]]]:
    processes: list[subprocess.Popen[str]] = []
    yield processes
    for process in processes:
        if process.poll() is None:
            process.kill()
            process.wait(5)


def test_nats_command_prints_urls_and_stops_on_sigterm(
    tmp_path: Path, stopped_at_end: list[subprocess.Popen[str]]
) -> None:
    port, mqtt_port, monitor = free_port(), free_port(), free_port()
    process = spawn(
        "nats",
        f"--port={port}",
        f"--mqtt-port={mqtt_port}",
        f"--monitor-port={monitor}",
        f"--store={tmp_path}",
    )
    stopped_at_end.append(process)
    assert process.stdout is not None
    lines = [process.stdout.readline() for _ in range(3)]
    assert f"nats://127.0.0.1:{port}" in lines[0]
    assert f"mqtt://127.0.0.1:{mqtt_port}" in lines[1]
    with urllib.request.urlopen(f"http://127.0.0.1:{monitor}/jsz", timeout=5) as answer:
        assert json.load(answer)["config"]["store_dir"].startswith(str(tmp_path))
    process.send_signal(signal.SIGTERM)
    assert process.wait(20) == 0


def test_nats_command_explains_a_taken_port(nats_server: EmbeddedNats) -> None:
    result = subprocess.run(
        [*TIDESHIFT, "nats", f"--port={nats_server.port}"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 1
    assert f"port {nats_server.port}" in result.stderr
    assert "already in use" in result.stderr


def test_version_prints_the_installed_version() -> None:
    result = subprocess.run(
        [*TIDESHIFT, "--version"], cwd=REPO, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == f"tideshift {importlib.metadata.version('tideshift')}"


def test_events_schema_prints_asyncapi() -> None:
    result = subprocess.run(
        [*TIDESHIFT, "events", "schema"], cwd=REPO, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    document = json.loads(result.stdout)
    assert document["asyncapi"] == "3.0.0"
    assert "scale_command" in document["channels"]


@pytest.mark.parametrize("via_mqtt", [False, True], ids=["nats", "mqtt"])
def test_events_tail_prints_one_cloudevent_per_line(
    nats_server: EmbeddedNats,
    unique: str,
    via_mqtt: bool,
    stopped_at_end: list[subprocess.Popen[str]],
) -> None:
    pattern = f"tideshift.v1.cluster.node.{unique}"
    args = ["events", "tail", pattern, "--count=1", f"--nats-url={nats_server.url}"]
    if via_mqtt:
        args += ["--mqtt", f"--mqtt-url=mqtt://127.0.0.1:{nats_server.mqtt_port}"]
    process = spawn(*args)
    stopped_at_end.append(process)
    node = events.NodeChanged(
        change="added",
        name=unique,
        allocatable=events.Resources(cpu=8, memory=32e9, gpu=1),
        observed_at=datetime(2026, 1, 1, tzinfo=UTC),
    )

    async def publish_until_tail_exits() -> None:
        # The tail subscribes asynchronously; publish until it has printed one and exited.
        bus = await Bus.connect(nats_server.url, name="tail-test")
        try:
            deadline = time.monotonic() + 30
            while process.poll() is None and time.monotonic() < deadline:
                await bus.publish(events.NODE_CHANGED.at(name=unique), node)
                await asyncio.sleep(0.1)
        finally:
            await bus.close()

    asyncio.run(publish_until_tail_exits())
    out, err = process.communicate(timeout=10)
    assert process.returncode == 0, err
    # exiting after --count closes the subscription before the connection drains
    assert "Task exception" not in err, err
    line = out.splitlines()[0]
    assert events.decode(line.encode(), events.NodeChanged).data == node


@pytest.mark.parametrize("transport", ["nats", "mqtt"])
def test_events_tail_says_what_to_do_when_nats_is_down(transport: str) -> None:
    where = f"--{transport}-url={transport}://127.0.0.1:{free_port()}"
    result = subprocess.run(
        [*TIDESHIFT, "events", "tail", where, *(["--mqtt"] if transport == "mqtt" else [])],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 1
    assert "tideshift nats" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr


@pytest.mark.parametrize("url", ["garbage", "nats://:4222", "nats://host:99999", "http://h:1"])
def test_events_tail_refuses_a_malformed_url_in_one_line(url: str) -> None:
    result = subprocess.run(
        [*TIDESHIFT, "events", "tail", f"--nats-url={url}"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        f"tideshift events tail: invalid --nats-url {url!r}: expected nats://host:port "
        "(scheme one of nats, tls, ws, wss)"
    ]


def test_nats_command_refuses_an_unwritable_store_in_one_line(tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    result = subprocess.run(
        [
            *TIDESHIFT,
            "nats",
            f"--store={blocker / 'store'}",
            "--port=0",
            "--mqtt-port=0",
            "--monitor-port=0",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith(f"tideshift nats: invalid --store: store {blocker / 'store'}")
    assert "choose a writable directory" in lines[0]


SERVICE = textwrap.dedent(
    """
    import sys
    from tideshift.services.common.runtime import ServiceContext, run_service
    from tideshift.services.common.settings import ServiceSettings, parse_settings

    async def body(context: ServiceContext) -> None:
        context.ready.set()
        print("port", context.health_port, flush=True)
        await context.stopping.wait()
        print("drained", flush=True)

    settings = parse_settings(ServiceSettings, sys.argv[1:], prog="probe")
    sys.exit(run_service("probe", settings, body))
    """
)


def test_service_runtime_embedded_default_health_and_clean_exit(
    stopped_at_end: list[subprocess.Popen[str]],
) -> None:
    env = {k: v for k, v in os.environ.items() if k != "TIDESHIFT_NATS_URL"}
    process = subprocess.Popen(
        [sys.executable, "-c", SERVICE, "--health-port=0", "--health-host=127.0.0.1"],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    stopped_at_end.append(process)
    assert process.stdout is not None
    port = int(process.stdout.readline().split()[1])
    base = f"http://127.0.0.1:{port}"

    def ready() -> bool:
        with urllib.request.urlopen(f"{base}/readyz", timeout=2) as answer:
            return bool(answer.status == 200)

    until(ready, 20.0)
    with urllib.request.urlopen(f"{base}/metrics", timeout=2) as answer:
        assert b"tideshift_bus_published_total" in answer.read()
    process.send_signal(signal.SIGTERM)
    assert process.wait(30) == 0
    assert "drained" in process.stdout.read()
    assert "started the bundled nats-server" in (process.stderr.read() if process.stderr else "")


def test_settings_errors_name_the_flag_and_environment_variable() -> None:
    result = subprocess.run(
        [sys.executable, "-c", SERVICE, "--health-port=99999"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2
    assert "--health-port" in result.stderr
    assert "TIDESHIFT_HEALTH_PORT" in result.stderr
    env_result = subprocess.run(
        [sys.executable, "-c", SERVICE],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "TIDESHIFT_LOG_LEVEL": "LOUD"},
    )
    assert env_result.returncode == 2
    assert "--log-level" in env_result.stderr
