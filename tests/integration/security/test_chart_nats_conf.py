"""The chart's NATS `authorization` block is generated from `permissions.ROLES`, and a real
nats-server accepts it with passwords from its environment, as the chart's Secret gives them."""

from __future__ import annotations

import os
import secrets
import subprocess
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from tideshift.services.common.bus import Bus, NatsAuthError
from tideshift.services.common.bus.permissions import (
    ROLES,
    nats_conf_authorization,
    password_variable,
)
from tideshift.services.common.embedded_nats import find_nats_server
from tideshift.services.common.ports import free_port

CHART_FILE = Path(__file__).resolve().parents[3] / "charts/tideshift/files/nats-authorization.conf"


def test_the_charts_authorization_block_is_current() -> None:
    assert CHART_FILE.read_text() == nats_conf_authorization(), (
        "stale: run python -m tideshift.services.common.bus.permissions "
        "> charts/tideshift/files/nats-authorization.conf"
    )


@pytest.fixture
def chart_configured_server() -> Iterator[tuple[str, dict[str, str]]]:
    """nats-server with the chart's block, each password in its environment variable."""
    passwords = {role: secrets.token_urlsafe(16) for role in ROLES}
    port, monitor = free_port(), free_port()
    with tempfile.TemporaryDirectory() as store:
        config = Path(store) / "nats.conf"
        head = f"host: 127.0.0.1\nport: {port}\nhttp_port: {monitor}\n"
        config.write_text(head + CHART_FILE.read_text())
        env = {**os.environ, **{password_variable(r): p for r, p in passwords.items()}}
        server = subprocess.Popen([str(find_nats_server()), "-c", str(config)], env=env)
        try:
            deadline = time.monotonic() + 60
            while not _healthy(monitor):
                assert server.poll() is None, "nats-server refused the config (or its ports)"
                assert time.monotonic() < deadline, "nats-server did not become healthy"
                time.sleep(0.05)
            yield f"nats://127.0.0.1:{port}", passwords
        finally:
            server.terminate()
            server.wait(10)


def _healthy(monitor: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{monitor}/healthz", timeout=1):
            return True
    except OSError:
        return False


async def test_nats_server_reads_the_passwords_from_its_environment(
    chart_configured_server: tuple[str, dict[str, str]],
) -> None:
    url, passwords = chart_configured_server
    bus = await Bus.connect(url, name="conf", user="planner", password=passwords["planner"])
    await bus.close()
    with pytest.raises(NatsAuthError):
        await Bus.connect(url, name="conf", user="planner", password=passwords["executor"])
