"""The chart's TLS and provisioning, run for real: the bundled NATS's rendered config, with a
certificate made here where the chart mounts the cert Secret, is served by a real nats-server;
the provisioning Job's command, as the `provisioner` and with the paths the chart gives every
pod, creates the streams and buckets; a service's login then uses them, and a pod without the
client certificate of a mutual-TLS server is refused at once."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.unit.chart.chart_support import CHART, run_helm
from tideshift.events.buckets import PINS_BUCKET
from tideshift.services.common.bus import Bus
from tideshift.services.common.bus.connect import (
    TLS_CA_VARIABLE,
    TLS_CERT_VARIABLE,
    TLS_KEY_VARIABLE,
    NatsTlsError,
)
from tideshift.services.common.bus.permissions import ROLES, password_variable
from tideshift.services.common.embedded_nats import find_nats_server
from tideshift.services.common.ports import free_port
from tideshift.services.devcluster.pki import CertificateAuthority

TLS_VALUES = (
    *("--set", "nats.tls.enabled=true"),
    *("--set", "nats.bundled.tls.secretName=nats-cert"),
    *("--set", "nats.bundled.tls.verifyClients=true"),
    *("--set", "nats.tls.clientSecret=tideshift-client"),
)
TIDESHIFT = str(Path(sys.executable).parent / "tideshift")


def rendered(*extra: str) -> list[dict[str, Any]]:
    out = run_helm("template", "ts", str(CHART), *TLS_VALUES, *extra).stdout
    return [doc for doc in yaml.safe_load_all(out) if doc]


def pod_of(docs: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    found = next(d for d in docs if d["kind"] == kind and d["metadata"]["name"] == name)
    pod: dict[str, Any] = found["spec"]["template"]["spec"]
    return pod


def tls_files(pod: dict[str, Any], containers: str = "containers") -> dict[str, str]:
    """Each TLS variable of the pod's first container -> the Secret and key of its file."""
    container = pod[containers][0]
    env = {item["name"]: item.get("value") for item in container["env"]}
    mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    volumes = {v["name"]: v.get("secret") for v in pod["volumes"]}
    files = {}
    for variable in (TLS_CA_VARIABLE, TLS_CERT_VARIABLE, TLS_KEY_VARIABLE):
        directory, key = env[variable].rsplit("/", 1)
        secret = volumes[mounts[directory]]
        assert key in [item["key"] for item in secret["items"]], variable
        files[variable] = f"{secret['secretName']}/{key}"
    return files


def test_every_service_and_the_provisioning_job_get_the_ca_and_client_certificate() -> None:
    docs = rendered()
    expected = {
        TLS_CA_VARIABLE: "nats-cert/ca.crt",
        TLS_CERT_VARIABLE: "tideshift-client/tls.crt",
        TLS_KEY_VARIABLE: "tideshift-client/tls.key",
    }
    for service in ("watcher", "predictor", "planner", "executor"):
        pod = pod_of(docs, "Deployment", f"ts-tideshift-{service}")
        assert tls_files(pod) == expected
        # It waits for the provisioning Job with its own login, over the same TLS.
        assert tls_files(pod, "initContainers") == expected
        (waiting,) = pod["initContainers"]
        assert waiting["args"] == ["nats", "provision", "--wait"]
        login = {item["name"]: item.get("value") for item in waiting["env"]}
        assert login["TIDESHIFT_NATS_USER"] == service
    job = pod_of(docs, "Job", "ts-tideshift-nats-provision-1")
    assert tls_files(job) == expected
    env = {item["name"]: item.get("value") for item in job["containers"][0]["env"]}
    assert env["TIDESHIFT_NATS_USER"] == "provisioner"
    server = pod_of(docs, "StatefulSet", "ts-tideshift-nats")
    (tls,) = [v for v in server["volumes"] if v["name"] == "tls"]
    assert tls["secret"]["secretName"] == "nats-cert"


def test_reaction_clients_get_the_ca_and_client_certificate_too() -> None:
    """The reaction Deployment and the `helm test` Pod read events over the same TLS."""
    docs = rendered("--set", "reactions.enabled=true", "--set", "reactions.script=pass")
    expected = {
        TLS_CA_VARIABLE: "nats-cert/ca.crt",
        TLS_CERT_VARIABLE: "tideshift-client/tls.crt",
        TLS_KEY_VARIABLE: "tideshift-client/tls.key",
    }
    reactions = pod_of(docs, "Deployment", "ts-tideshift-reactions")
    assert tls_files(reactions) == expected
    check = next(d for d in docs if d["metadata"]["name"] == "ts-tideshift-test-pipeline")
    assert tls_files(check["spec"]) == expected
    reactions_on = ("--set", "reactions.enabled=true", "--set", "reactions.script=pass")
    plain = run_helm("template", "ts", str(CHART), *reactions_on).stdout
    assert "ts-tideshift-reactions" in plain and "TIDESHIFT_NATS_TLS_" not in plain


@pytest.fixture(scope="module")
def chart_tls_nats(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """The rendered bundled config, its cert Secret's files made here, run by nats-server."""
    tmp = tmp_path_factory.mktemp("chart-tls")
    authority = CertificateAuthority("chart-test-ca")
    ca, _ = authority.pair.write(tmp, "ca")
    authority.issue_server("nats", dns_names=["localhost"], ips=["127.0.0.1"]).write(tmp, "tls")
    client_cert, client_key = authority.issue_client("tideshift").write(tmp, "client")
    config_map = next(
        d for d in rendered() if d["kind"] == "ConfigMap" and "nats.conf" in d["data"]
    )
    port, mqtt, monitor = free_port(), free_port(), free_port()
    text = config_map["data"]["nats.conf"]
    for old, new in (
        ("store_dir: /data", f"store_dir: {tmp / 'store'}"),
        ("port: 4222", f"port: {port}"),
        ("http_port: 8222", f"http_port: {monitor}"),
        ("port: 1883", f"port: {mqtt}"),
        ("/etc/nats/tls/", f"{tmp}/"),
    ):
        assert old in text
        text = text.replace(old, new)
    (tmp / "nats.conf").write_text(text)
    passwords = {role: f"pw-{role}-{port}" for role in ROLES}
    env = {**os.environ, "POD_NAME": "chart"}
    env |= {password_variable(r): p for r, p in passwords.items()}
    server = subprocess.Popen([str(find_nats_server()), "-c", str(tmp / "nats.conf")], env=env)
    try:
        deadline = time.monotonic() + 60
        while not _healthy(monitor):
            assert server.poll() is None, "nats-server refused the chart's TLS config"
            assert time.monotonic() < deadline, "nats-server did not become healthy"
            time.sleep(0.05)
        yield {
            "url": f"nats://127.0.0.1:{port}",
            "passwords": passwords,
            "tls": {
                TLS_CA_VARIABLE: str(ca),
                TLS_CERT_VARIABLE: str(client_cert),
                TLS_KEY_VARIABLE: str(client_key),
            },
        }
    finally:
        server.terminate()
        server.wait(10)


def _healthy(monitor: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{monitor}/healthz", timeout=1):
            return True
    except OSError:
        return False


def test_the_provisioning_job_then_a_service_work_over_mutual_tls(
    chart_tls_nats: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TIDESHIFT_")}
    env |= chart_tls_nats["tls"] | {
        "TIDESHIFT_NATS_URL": chart_tls_nats["url"],
        "TIDESHIFT_NATS_USER": "provisioner",
        "TIDESHIFT_NATS_PASSWORD": chart_tls_nats["passwords"]["provisioner"],
    }
    job = subprocess.run(
        [TIDESHIFT, "nats", "provision"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert job.returncode == 0, job.stderr

    async def planner_opens_its_pins() -> None:
        bus = await Bus.connect(
            chart_tls_nats["url"],
            name="chart-planner",
            user="planner",
            password=chart_tls_nats["passwords"]["planner"],
        )
        try:
            assert await (await bus.kv(PINS_BUCKET)).keys() == []
        finally:
            await bus.close()

    for variable, path in chart_tls_nats["tls"].items():
        monkeypatch.setenv(variable, path)
    asyncio.run(planner_opens_its_pins())


async def test_a_pod_without_the_client_certificate_is_refused_at_once(
    chart_tls_nats: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(TLS_CA_VARIABLE, chart_tls_nats["tls"][TLS_CA_VARIABLE])
    monkeypatch.delenv(TLS_CERT_VARIABLE, raising=False)
    monkeypatch.delenv(TLS_KEY_VARIABLE, raising=False)
    with pytest.raises(NatsTlsError, match=TLS_CERT_VARIABLE):
        await Bus.connect(
            chart_tls_nats["url"],
            name="chart-planner",
            user="planner",
            password=chart_tls_nats["passwords"]["planner"],
            connect_timeout=60,
        )
