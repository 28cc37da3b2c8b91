"""The chart hands each pod its role's NATS login and runs the bundled server with the
permissions generated from `permissions.ROLES` (files/nats-authorization.conf, each password
a variable from the server's environment); a real nats-server accepts the rendered config."""

from __future__ import annotations

import os
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.unit.chart.chart_support import CHART, SERVICES, run_helm
from tideshift.services.common.bus import Bus, NatsAuthError
from tideshift.services.common.bus.permissions import (
    ROLES,
    nats_conf_authorization,
    password_variable,
)
from tideshift.services.common.bus.provision import check_provisioned, provision_at
from tideshift.services.common.embedded_nats import find_nats_server
from tideshift.services.common.ports import free_port

CONF = CHART / "files" / "nats-authorization.conf"


def test_the_charts_authorization_block_is_current() -> None:
    assert CONF.read_text() == nats_conf_authorization(), (
        "stale: run python -m tideshift.services.common.bus.permissions "
        "> charts/tideshift/files/nats-authorization.conf"
    )


def rendered(*args: str) -> list[dict[str, Any]]:
    out = run_helm("template", "ts", str(CHART), *args).stdout
    return [doc for doc in yaml.safe_load_all(out) if doc]


def env_of(doc: dict[str, Any]) -> dict[str, Any]:
    container = doc["spec"]["template"]["spec"]["containers"][0]
    return {item["name"]: item.get("value", item.get("valueFrom")) for item in container["env"]}


def test_each_service_gets_its_own_roles_login_from_the_generated_secret() -> None:
    docs = rendered()
    secret = next(d for d in docs if d["metadata"]["name"] == "ts-tideshift-nats-users")
    assert set(secret["data"]) == set(ROLES)
    for service in SERVICES:
        deployment = next(
            d
            for d in docs
            if d["kind"] == "Deployment" and d["metadata"]["name"] == f"ts-tideshift-{service}"
        )
        env = env_of(deployment)
        assert env["TIDESHIFT_NATS_USER"] == service
        reference = env["TIDESHIFT_NATS_PASSWORD"]["secretKeyRef"]
        assert reference == {"name": "ts-tideshift-nats-users", "key": service}


def test_an_external_nats_with_a_creds_file_gets_no_generated_logins() -> None:
    docs = rendered(
        "--set", "nats.bundled.enabled=false", "--set", "nats.url=nats://nats.example:4222"
    )
    assert not [d for d in docs if d["metadata"]["name"].endswith("-nats-users")]
    deployment = next(
        d
        for d in docs
        if d["kind"] == "Deployment" and d["metadata"]["name"] == "ts-tideshift-planner"
    )
    assert "TIDESHIFT_NATS_USER" not in env_of(deployment)


@pytest.fixture
def chart_nats(tmp_path: Path) -> Iterator[tuple[str, dict[str, str]]]:
    """The bundled server's rendered nats.conf, run by a real nats-server."""
    config_map = next(
        d for d in rendered() if d["kind"] == "ConfigMap" and "nats.conf" in d["data"]
    )
    port, mqtt, monitor = free_port(), free_port(), free_port()
    text = config_map["data"]["nats.conf"]
    for old, new in (
        ("store_dir: /data", f"store_dir: {tmp_path}"),
        ("port: 4222", f"port: {port}"),
        ("http_port: 8222", f"http_port: {monitor}"),
        ("port: 1883", f"port: {mqtt}"),
    ):
        assert old in text
        text = text.replace(old, new)
    (tmp_path / "nats.conf").write_text(text)
    passwords = {role: f"pw-{role}-{port}" for role in ROLES}
    env = {
        **os.environ,
        "POD_NAME": "chart",
        **{password_variable(r): p for r, p in passwords.items()},
    }
    server = subprocess.Popen([str(find_nats_server()), "-c", str(tmp_path / "nats.conf")], env=env)
    try:
        deadline = time.monotonic() + 60
        while not _healthy(monitor):
            assert server.poll() is None, "nats-server refused the chart's config"
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


async def test_the_rendered_bundled_config_logs_in_each_role(
    chart_nats: tuple[str, dict[str, str]],
) -> None:
    url, passwords = chart_nats
    await provision_at(url, user="provisioner", password=passwords["provisioner"])
    planner = await Bus.connect(url, name="chart", user="planner", password=passwords["planner"])
    try:
        await check_provisioned(planner)
    finally:
        await planner.close()
    with pytest.raises(NatsAuthError):
        await Bus.connect(url, name="chart", connect_timeout=30)
    with pytest.raises(NatsAuthError):
        await Bus.connect(url, name="chart", user="planner", password=passwords["executor"])
