"""values.schema.json: generated from the services' settings, and it rejects bad values with
a message that names the key and what was expected."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.unit.chart.chart_support import CHART, load_schema_builder, render, render_error

BUILDER = load_schema_builder()


def test_committed_schema_is_what_the_builder_generates() -> None:
    committed = (CHART / "values.schema.json").read_text()
    assert committed == BUILDER.render(), (
        "values.schema.json is stale: run python charts/tideshift/schema/build_values_schema.py"
    )


def test_every_object_in_the_schema_forbids_unknown_keys() -> None:
    def walk(node: Any, where: str) -> None:
        if isinstance(node, dict):
            if node.get("type") == "object" and "properties" in node:
                assert node.get("additionalProperties") is False, where
            for key, value in node.items():
                walk(value, f"{where}/{key}")
        elif isinstance(node, list):
            for index, value in enumerate(node):
                walk(value, f"{where}/{index}")

    walk(BUILDER.build_schema(), "")


BAD_VALUES = [
    # values, fragments the error must contain
    pytest.param(
        {"planner": {"replicas": "two"}}, ["/planner/replicas", "string", "integer"], id="type"
    ),
    pytest.param({"replicas": 2}, ["additional properties", "'replicas'"], id="unknown-top-key"),
    pytest.param(
        {"executor": {"replica": 3}}, ["/executor", "additional properties", "'replica'"], id="typo"
    ),
    pytest.param(
        {"executor": {"config": {"dryrun": True}}},
        ["/executor/config", "additional properties", "'dryrun'"],
        id="unknown-setting",
    ),
    pytest.param(
        {"executor": {"config": {"max_step": -1}}},
        ["/executor/config/max_step", "minimum"],
        id="setting-bound",
    ),
    pytest.param(
        {"config": {"log_level": "LOUD"}}, ["/config/log_level", "LOUD"], id="setting-pattern"
    ),
    pytest.param(
        {"watcher": {"config": {"resync_seconds": "often"}}},
        ["/watcher/config/resync_seconds"],
        id="setting-type",
    ),
    pytest.param(
        {"planner": {"config": {"serving": [{"namespace": "shop", "name": "web"}]}}},
        ["/planner/config/serving/0", "missing properties", "'cpu'", "'capacity_rps'"],
        id="serving-entry-incomplete",
    ),
    pytest.param(
        {
            "planner": {
                "config": {
                    "training": [
                        {"namespace": "ml", "name": "ctr", "cpu": 4, "max_trainers": 8, "gpus": 1}
                    ]
                }
            }
        },
        ["/planner/config/training/0", "additional properties 'gpus' not allowed"],
        id="training-entry-typo",
    ),
    pytest.param(
        {"predictor": {"config": {"model": "prophet"}}},
        ["/predictor/config/model", "tidal"],
        id="unknown-model",
    ),
    pytest.param(
        {"planner": {"config": {"policy": "greedy"}}},
        ["/planner/config/policy", "tideshift", "edl"],
        id="unknown-policy",
    ),
    pytest.param(
        {"planner": {"config": {"overcommit_margin": 0.2}}},
        ["/planner/config/overcommit_margin", "moved: set lending.lend_margin"],
        id="planner-margin-moved",
    ),
    pytest.param(
        {"executor": {"config": {"batch_margin": 0.2}}},
        ["/executor/config/batch_margin", "moved: set lending.lend_margin"],
        id="executor-margin-moved",
    ),
    pytest.param(
        {"executor": {"config": {"lend_margin": 0.2}}},
        ["/executor/config", "additional properties", "'lend_margin'"],
        id="lend-margin-is-chart-wide",
    ),
    pytest.param({"lending": {"lend_margin": 1.5}}, ["/lending/lend_margin"], id="lend-margin"),
    pytest.param({"healthPort": 70000}, ["/healthPort", "maximum"], id="port"),
    pytest.param(
        {"nats": {"url": "http://nats:4222"}}, ["/nats/url", "http://nats:4222"], id="nats-scheme"
    ),
    pytest.param(
        {"nats": {"bundled": {"jetstream": {"maxFile": "lots"}}}},
        ["/nats/bundled/jetstream/maxFile", "lots"],
        id="nats-size",
    ),
    pytest.param(
        {"nats": {"bundled": {"persistence": {"whenDeleted": "Keep"}}}},
        ["/nats/bundled/persistence/whenDeleted", "Retain", "Delete"],
        id="enum",
    ),
    pytest.param({"image": {"pullPolicy": "Sometimes"}}, ["/image/pullPolicy"], id="pull-policy"),
    pytest.param(
        {"priorityClasses": {"serving": {"name": "Serving_Class"}}},
        ["/priorityClasses/serving/name"],
        id="kube-name",
    ),
]


@pytest.mark.parametrize(("values", "fragments"), BAD_VALUES)
def test_schema_rejects_bad_values_naming_the_key(
    values: dict[str, Any], fragments: list[str], tmp_path: Path
) -> None:
    error = render_error(tmp_path, values)
    assert "values don't meet the specifications of the schema" in error
    for fragment in fragments:
        assert fragment in error, f"{fragment!r} not in:\n{error}"


def test_schema_accepts_a_full_set_of_non_default_values(tmp_path: Path) -> None:
    objects = render(
        tmp_path,
        {
            "commonLabels": {"team": "platform"},
            "image": {"repository": "r.example/ts", "tag": "1.0.0", "pullPolicy": "Always"},
            "imagePullSecrets": [{"name": "regcred"}],
            "healthPort": 9000,
            "config": {"log_level": "DEBUG", "max_message_bytes": 2048},
            "lending": {"lend_margin": 0.2},
            "podDisruptionBudget": {"enabled": False},
            "metrics": {"service": {"enabled": False}},
            "priorityClassName": "system-cluster-critical",
            "priorityClasses": {"create": True, "serving": {"value": 5000}},
            "nats": {
                "bundled": {
                    "mqtt": {"enabled": False},
                    "jetstream": {"maxMemory": "1G", "maxFile": "10Gi"},
                    "persistence": {"storageClassName": "fast", "size": "20Gi"},
                }
            },
            "executor": {"config": {"dry_run": True}, "extraRules": []},
            "watcher": {"config": {"label_selector": "tier=web"}, "tolerations": []},
            "reactions": {"enabled": True, "existingConfigMap": "my-reaction"},
        },
    )
    kinds = {obj["kind"] for obj in objects}
    assert "PodDisruptionBudget" not in kinds
    assert "PriorityClass" in kinds
