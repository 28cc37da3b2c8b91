"""Every PromQL expression of the chart's dashboard and alerts, against a real Prometheus that
scrapes the real services (processes on a real nats-server and the local control plane): each
dashboard query returns series with values, each series an alert reads exists, Prometheus
evaluates every rule without error, and the alerts the test provokes fire (a dead letter, a
rejected command) while the healthy planner's does not."""

from __future__ import annotations

import asyncio
import math
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import nats
import pytest
import yaml

from tests.integration.observability.stack import (
    ALERTS,
    Stack,
    dashboard_queries,
    monitored_stack,
    selectors,
    wait_for_scrapes,
)
from tests.k8s.cluster_objects import collection, create, pod_template
from tideshift.events import SCALE_COMMAND, ScaleCommand, WorkloadRef
from tideshift.services.common.bus import Bus

pytestmark = [pytest.mark.slow, pytest.mark.prometheus, pytest.mark.timeout(600)]


@pytest.fixture(scope="module")
def stack(
    k8s_cluster: Any, prometheus_binary: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Stack]:
    with monitored_stack(k8s_cluster, prometheus_binary, tmp_path_factory.mktemp("obs")) as s:
        wait_for_scrapes(s)
        plain = {  # unlabelled: Tideshift does not manage it
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {"name": "plain"},
            "spec": {
                "replicas": 1,
                "selector": {"matchLabels": {"app": "plain"}},
                "template": pod_template({"app": "plain"}),
            },
        }
        create(s.admin, collection("Deployment", s.namespace), plain)
        s.set_rate(150.0)  # one replica serves 100 req/s: web must grow
        yield s


def has_values(result: list[dict[str, Any]]) -> bool:
    return any(math.isfinite(float(series["value"][1])) for series in result)


async def dead_letter(nats_url: str) -> None:
    """Bytes that are no event, on a subject the planner follows: it dead-letters them."""
    connection = await nats.connect(nats_url)
    try:
        await connection.publish("tideshift.v1.cluster.node.garbage", b"not an event")
        await connection.flush()
    finally:
        await connection.close()


async def command_an_unlabelled_deployment(nats_url: str, namespace: str) -> None:
    """A scale command for a Deployment Tideshift does not manage: the executor rejects it."""
    bus = await Bus.connect(nats_url, name="obs-test")
    try:
        target = WorkloadRef(namespace, "Deployment", "plain")
        key = f"obs-{uuid.uuid4().hex[:8]}"
        command = ScaleCommand(
            target=target,
            desired=3,
            reason="a command the executor must refuse",
            plan_id=key,
            issued_at=datetime.now(UTC),
            idempotency_key=key,
            issuer="operator",
        )
        subject = SCALE_COMMAND.at(namespace=namespace, kind=target.kind, name="plain")
        await bus.publish_durable(subject, command, msg_id=key)
    finally:
        await bus.close()


def alerts_by_name(stack: Stack) -> dict[str, set[str]]:
    states: dict[str, set[str]] = {}
    for alert in stack.api("alerts")["alerts"]:
        states.setdefault(alert["labels"]["alertname"], set()).add(alert["state"])
    return states


def test_every_dashboard_query_returns_series_from_the_services(stack: Stack) -> None:
    web = f"{collection('Deployment', stack.namespace)}/web"
    stack.eventually(
        lambda: stack.admin.get(web)["spec"]["replicas"] >= 2, "web scaled for 150 req/s"
    )
    asyncio.run(command_an_unlabelled_deployment(stack.nats_url, stack.namespace))
    asyncio.run(dead_letter(stack.nats_url))
    missing = []
    for title, legend, expr in dashboard_queries():
        try:
            stack.eventually(lambda e=expr: has_values(stack.query(e)), expr, timeout=180)
        except TimeoutError:
            missing.append(f"{title} / {legend}: {expr}")
    assert not missing, "dashboard queries without series:\n" + "\n".join(missing)


def test_every_series_an_alert_reads_exists_and_every_rule_evaluates(stack: Stack) -> None:
    asyncio.run(command_an_unlabelled_deployment(stack.nats_url, stack.namespace))
    asyncio.run(dead_letter(stack.nats_url))
    groups = yaml.safe_load(ALERTS.read_text())["groups"]
    rules = [rule for group in groups for rule in group["rules"]]
    wanted = sorted({s for rule in rules for s in selectors(rule["expr"])})
    assert len(wanted) >= 6
    for selector in wanted:
        stack.eventually(lambda s=selector: stack.query(f"group({s})"), f"series of {selector}")

    def evaluated() -> list[dict[str, Any]]:
        loaded = [r for g in stack.api("rules")["groups"] for r in g["rules"]]
        done = [r for r in loaded if not r["lastEvaluation"].startswith("0001")]
        return loaded if len(done) == len(rules) else []

    loaded = stack.eventually(evaluated, "every rule evaluated once")
    assert {r["name"] for r in loaded} == {r["alert"] for r in rules}
    assert [(r["name"], r.get("lastError")) for r in loaded if r["health"] != "ok"] == []

    def provoked_fire() -> dict[str, set[str]]:
        states = alerts_by_name(stack)
        wanted = {"TideshiftDeadLettersRising", "TideshiftCommandsFailing"}
        return states if all("firing" in states.get(n, set()) for n in wanted) else {}

    stack.eventually(provoked_fire, "the provoked alerts firing")
    stack.eventually(
        lambda: "TideshiftPlannerNotLeading" not in alerts_by_name(stack),
        "no not-leading alert while the planner leads",
    )
    assert "TideshiftPlannerAbsent" not in alerts_by_name(stack)
