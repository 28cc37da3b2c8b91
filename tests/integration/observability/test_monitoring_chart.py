"""The chart's dashboard, alerts and scrape objects: off by default; on, they ship the files
under charts/tideshift/dashboards/ as they are, `promtool check rules` accepts the rendered
rules, and the monitors select exactly the services' metrics endpoints."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.fixtures.requirements import missing_dependency
from tests.unit.chart.chart_support import CHART, SERVICES, by_kind, render

ALL_ON = {
    "metrics": {
        "dashboard": {"enabled": True, "annotations": {"grafana_folder": "Tideshift"}},
        "prometheusRule": {"enabled": True, "labels": {"release": "kube-prometheus"}},
        "serviceMonitor": {"enabled": True, "interval": "15s"},
        "podMonitor": {"enabled": True},
    }
}
MONITORING_KINDS = ("PrometheusRule", "ServiceMonitor", "PodMonitor")


@pytest.fixture(scope="module")
def objects(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    return render(tmp_path_factory.mktemp("monitoring"), ALL_ON)


def promtool() -> str:
    found = shutil.which("promtool")
    if found is None:
        missing_dependency("promtool is missing: install the Debian package `prometheus`")
    return found


def test_nothing_is_rendered_by_default(tmp_path: Path) -> None:
    objects = render(tmp_path)
    assert not [o for o in objects if o["kind"] in MONITORING_KINDS]
    assert not [
        o
        for o in by_kind(objects, "ConfigMap").values()
        if o["metadata"]["name"].endswith("-dashboard")
    ]


def test_the_dashboard_configmap_carries_the_sidecar_label_and_the_json_file(
    objects: list[dict[str, Any]],
) -> None:
    config_map = by_kind(objects, "ConfigMap")["ts-tideshift-dashboard"]
    assert config_map["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert config_map["metadata"]["annotations"] == {"grafana_folder": "Tideshift"}
    shipped = json.loads(config_map["data"]["tideshift.json"])
    assert shipped == json.loads((CHART / "dashboards" / "tideshift.json").read_text())


def test_the_rendered_rules_are_the_alerts_file_and_promtool_accepts_them(
    objects: list[dict[str, Any]], tmp_path: Path
) -> None:
    rule = by_kind(objects, "PrometheusRule")["ts-tideshift"]
    assert rule["metadata"]["labels"]["release"] == "kube-prometheus"
    alerts = yaml.safe_load((CHART / "dashboards" / "alerts.yaml").read_text())
    assert rule["spec"]["groups"] == alerts["groups"]
    rendered = tmp_path / "rules.yaml"
    rendered.write_text(yaml.safe_dump({"groups": rule["spec"]["groups"]}))
    result = subprocess.run(
        [promtool(), "check", "rules", str(rendered)], capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {sum(len(g['rules']) for g in alerts['groups'])} rules found" in result.stdout


def test_the_monitors_select_the_service_pods_and_metrics_services_only(
    objects: list[dict[str, Any]],
) -> None:
    monitor = by_kind(objects, "ServiceMonitor")["ts-tideshift"]
    assert monitor["spec"]["endpoints"] == [{"port": "http", "path": "/metrics", "interval": "15s"}]
    pods = by_kind(objects, "PodMonitor")["ts-tideshift"]
    assert pods["spec"]["podMetricsEndpoints"][0]["interval"] == "30s"
    services = by_kind(objects, "Service")
    deployments = by_kind(objects, "Deployment")
    for scrape, candidates in ((monitor, services), (pods, deployments)):
        assert scrape["spec"]["namespaceSelector"] == {"matchNames": ["tideshift"]}
        chosen = {name for name, obj in candidates.items() if _selects(scrape, _labels(obj))}
        expected = {
            name for name, obj in candidates.items() if _labels(obj).get(COMPONENT) in SERVICES
        }
        assert chosen == expected
        assert len(chosen) == len(SERVICES)
        if scrape is monitor:  # the metrics Services, not NATS's
            assert all(name.endswith("-metrics") for name in chosen)


COMPONENT = "app.kubernetes.io/component"


def _labels(obj: dict[str, Any]) -> dict[str, str]:
    if obj["kind"] == "Deployment":
        return dict(obj["spec"]["template"]["metadata"]["labels"])
    return dict(obj["metadata"]["labels"])


def _selects(scrape: dict[str, Any], labels: dict[str, str]) -> bool:
    selector = scrape["spec"]["selector"]
    matched = all(labels.get(k) == v for k, v in selector["matchLabels"].items())
    return matched and all(
        labels.get(e["key"]) in e["values"] for e in selector["matchExpressions"]
    )
