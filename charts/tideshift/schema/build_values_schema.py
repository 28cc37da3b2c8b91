"""Writes charts/tideshift/values.schema.json: the chart's own keys plus each service's settings.

    python charts/tideshift/schema/build_values_schema.py          # rewrite the schema
    python charts/tideshift/schema/build_values_schema.py --check  # exit 1 if it is stale

The `config` blocks are derived from the services' pydantic settings classes, so a value the
service would reject (a wrong type, a bound, an unknown setting) is already rejected by
`helm install`. Every object forbids unknown keys: a misspelt key fails instead of being
silently ignored. tests/unit/chart/ checks the committed file equals this script's output.
"""

from __future__ import annotations

import argparse
import copy
import importlib
import json
import sys
from pathlib import Path
from typing import Any

CHART = Path(__file__).resolve().parents[1]
SCHEMA_PATH = CHART / "values.schema.json"
SERVICES = ("watcher", "predictor", "planner", "executor")
SETTINGS_CLASSES = {
    "watcher": "tideshift.services.watcher.service:WatcherSettings",
    "predictor": "tideshift.services.predictor.settings:PredictorSettings",
    "planner": "tideshift.services.planner.settings:PlannerSettings",
    "executor": "tideshift.services.executor.service:ExecutorSettings",
}
# Settings validated in code against a registry: the schema lists the registry's names.
REGISTRY_ENUMS = {
    ("planner", "policy"): "tideshift.services.planner.core.baselines:POLICIES",
    ("predictor", "model"): "tideshift.services.predictor.core.models:MODELS",
}
# Settings the chart sets itself: NATS from the Secret (its replicas from nats.replicas or
# nats.bundled.replicas), the pod name, the probe port.
CHART_MANAGED_SETTINGS = frozenset(
    {
        "nats_url",
        "nats_credentials",
        "nats_user",
        "nats_password",
        "nats_password_file",
        "nats_replicas",
        "instance",
        "health_host",
        "health_port",
    }
)
Schema = dict[str, Any]
# The settings classes are imported from this checkout, whatever the current directory.
sys.path.insert(0, str(CHART.parents[1]))


def settings_class(service: str) -> Any | None:
    """The service's settings class, or None while that service is not written yet."""
    module_name, class_name = SETTINGS_CLASSES[service].split(":")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as error:
        if error.name and module_name.startswith(error.name):
            return None
        raise
    return getattr(module, class_name, None)


def shared_settings_class() -> Any:
    from tideshift.services.common.settings import ServiceSettings

    return ServiceSettings


def lending_settings_class() -> Any:
    from tideshift.services.common.settings import LendingSettings

    return LendingSettings


def lending_fields() -> set[str]:
    """The lending section's settings: one top-level `lending` value each, rendered into every
    service whose settings lend (planner and executor), so the two cannot disagree."""
    return set(lending_settings_class().model_fields) - set(shared_settings_class().model_fields)


def lends(service: str) -> bool:
    """Whether the service reads the lending section (its settings extend `LendingSettings`)."""
    model = settings_class(service)
    return model is not None and issubclass(model, lending_settings_class())


def _moved_to_lending(config: Schema) -> None:
    """A lending service's config: the lending settings are `lending`'s, not its own; their old
    names fail with a message saying where they went."""
    for name in lending_fields():
        config["properties"].pop(name, None)
    for old, new in lending_settings_class().renamed.items():
        moved = f"moved: set lending.{new} (one value for planner and executor)"
        config["properties"][old] = {"description": moved, "const": moved}


def _inline_refs(node: Any, definitions: Schema) -> Any:
    """Replace pydantic's `$ref`s into `$defs` by copies: the block is embedded elsewhere."""
    if isinstance(node, dict):
        if "$ref" in node:
            name = node["$ref"].rsplit("/", 1)[-1]
            resolved = _inline_refs(copy.deepcopy(definitions[name]), definitions)
            extra = {key: value for key, value in node.items() if key != "$ref"}
            return {**resolved, **_inline_refs(extra, definitions)}
        return {
            key: _inline_refs(value, definitions)
            for key, value in node.items()
            if key not in {"title", "$defs"}
        }
    if isinstance(node, list):
        return [_inline_refs(item, definitions) for item in node]
    return node


def settings_schema(model: Any, *, fields: set[str] | None, description: str) -> Schema:
    """The object schema of some settings fields, every key optional, no unknown keys."""
    full = model.model_json_schema()
    definitions = full.get("$defs", {})
    properties = {
        name: _inline_refs(schema, definitions)
        for name, schema in full["properties"].items()
        if name not in CHART_MANAGED_SETTINGS and (fields is None or name in fields)
    }
    return {
        "type": "object",
        "description": description,
        "additionalProperties": False,
        "properties": properties,
    }


def obj(properties: Schema, description: str = "") -> Schema:
    schema: Schema = {"type": "object", "additionalProperties": False, "properties": properties}
    if description:
        schema["description"] = description
    return schema


def string(description: str = "", **constraints: Any) -> Schema:
    return {
        "type": "string",
        **({"description": description} if description else {}),
        **constraints,
    }


def integer(description: str = "", **constraints: Any) -> Schema:
    schema: Schema = {"type": "integer", **constraints}
    if description:
        schema["description"] = description
    return schema


BOOLEAN: Schema = {"type": "boolean"}
STRING_MAP: Schema = {"type": "object", "additionalProperties": {"type": "string"}}
FREE_OBJECT: Schema = {"type": "object"}
LIST_OF_OBJECTS: Schema = {"type": "array", "items": {"type": "object"}}
QUANTITY: Schema = {"type": ["string", "integer", "number"]}
RESOURCES = obj(
    {
        "requests": {"type": "object", "additionalProperties": QUANTITY},
        "limits": {"type": "object", "additionalProperties": QUANTITY},
        "claims": LIST_OF_OBJECTS,
    },
    "container resources (requests and limits)",
)
KUBE_NAME = string(pattern="^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$", maxLength=253)
# Bytes with the suffixes nats-server understands (K, M, G, T with B or i, or none).
NATS_SIZE = string(pattern="^[0-9]+([KMGT](i|B|iB)?)?$")
PORT = integer(minimum=1, maximum=65535)
PULL_POLICY: Schema = {"enum": ["Always", "IfNotPresent", "Never"]}
PRIORITY_CLASSES = obj(
    {
        "create": BOOLEAN,
        "serving": obj({"name": KUBE_NAME, "value": integer(maximum=1000000000)}),
        "training": obj(
            {
                "name": KUBE_NAME,
                "value": integer(maximum=1000000000),
                "preemptionPolicy": {"enum": ["Never", "PreemptLowerPriority"]},
            },
        ),
    }
)
NATS = obj(
    {
        "existingSecret": string(),
        "secretKeys": obj({"url": string(minLength=1), "credentials": string()}),
        "url": string(pattern="^$|^(nats|tls|ws|wss)://"),
        "credentials": string(),
        "replicas": integer(minimum=1, maximum=5),
        "auth": obj({"enabled": BOOLEAN, "existingSecret": string()}),
        "provision": obj({"enabled": BOOLEAN}),
        "tls": obj({"enabled": BOOLEAN, "caSecret": string(), "clientSecret": string()}),
        "bundled": obj(
            {
                "enabled": BOOLEAN,
                "replicas": {"enum": [1, 3, 5]},
                "clusterPort": PORT,
                "tls": obj({"secretName": string(), "verifyClients": BOOLEAN}),
                "image": obj(
                    {
                        "repository": string(minLength=1),
                        "tag": string(minLength=1),
                        "pullPolicy": PULL_POLICY,
                    }
                ),
                "port": PORT,
                "monitorPort": PORT,
                "mqtt": obj({"enabled": BOOLEAN, "port": PORT}),
                "jetstream": obj({"maxMemory": NATS_SIZE, "maxFile": NATS_SIZE}),
                "persistence": obj(
                    {
                        "enabled": BOOLEAN,
                        "storageClassName": string(),
                        "size": string(pattern="^[0-9]+(\\.[0-9]+)?([KMGTPE]i?)?$"),
                        "whenDeleted": {"enum": ["Retain", "Delete"]},
                    }
                ),
                "resources": RESOURCES,
                "nodeSelector": STRING_MAP,
                "tolerations": LIST_OF_OBJECTS,
            }
        ),
    }
)
RBAC = obj(
    {
        "namespaced": BOOLEAN,
        "namespaces": {
            "type": "array",
            "items": string(pattern="^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$"),
            "uniqueItems": True,
        },
    }
)
REACTIONS = obj(
    {
        "enabled": BOOLEAN,
        "replicas": integer(minimum=0),
        "script": string(),
        "existingConfigMap": string(),
        "scriptKey": string(pattern="^[-._a-zA-Z0-9]+$"),
        "extraEnv": LIST_OF_OBJECTS,
        "resources": RESOURCES,
    }
)


def service_schema(service: str) -> Schema:
    model = settings_class(service)
    if model is None:
        config: Schema = {
            "type": "object",
            "description": f"settings of `tideshift run {service}` (not checked: no class yet)",
        }
    else:
        config = settings_schema(
            model,
            fields=None,
            description=f"settings of `tideshift run {service}`; shared ones override `config`",
        )
        for (owner, name), registry in REGISTRY_ENUMS.items():
            if owner == service and name in config["properties"]:
                module_name, attribute = registry.split(":")
                names = getattr(importlib.import_module(module_name), attribute)
                config["properties"][name]["enum"] = sorted(names)
        if lends(service):
            _moved_to_lending(config)
    properties: Schema = {
        "enabled": BOOLEAN,
        "replicas": integer(minimum=0),
        # null takes the chart-wide `image`'s field.
        "image": obj(
            {
                "repository": {"type": ["string", "null"], "minLength": 1},
                "tag": {"type": ["string", "null"]},
            }
        ),
        "resources": RESOURCES,
        "serviceAccountAnnotations": STRING_MAP,
        "extraEnv": LIST_OF_OBJECTS,
        "podAnnotations": STRING_MAP,
        "nodeSelector": STRING_MAP,
        "tolerations": LIST_OF_OBJECTS,
        "affinity": FREE_OBJECT,
        "config": config,
    }
    if service in {"watcher", "executor"}:
        properties["extraRules"] = LIST_OF_OBJECTS
    return obj(properties, f"the {service} Deployment")


def build_schema() -> Schema:
    shared = shared_settings_class()
    return {
        "$schema": "http://json-schema.org/draft-07/schema#",
        "title": "Tideshift Helm chart values",
        "type": "object",
        "additionalProperties": False,
        "properties": {
            # Helm passes `global` to every chart; accepted and unused.
            "global": FREE_OBJECT,
            "nameOverride": string(),
            "fullnameOverride": string(),
            "commonLabels": STRING_MAP,
            "image": obj(
                {
                    "repository": string(minLength=1),
                    "tag": string(),
                    "pullPolicy": PULL_POLICY,
                }
            ),
            "imagePullSecrets": LIST_OF_OBJECTS,
            "healthPort": PORT,
            "config": settings_schema(
                shared,
                fields=set(shared.model_fields),
                description="settings shared by every service",
            ),
            "lending": settings_schema(
                lending_settings_class(),
                fields=lending_fields(),
                description="lending idle serving reservation to batch trainers: rendered "
                "into both the planner and the executor",
            ),
            "podSecurityContext": FREE_OBJECT,
            "securityContext": FREE_OBJECT,
            "podDisruptionBudget": obj(
                {"enabled": BOOLEAN, "maxUnavailable": {"type": ["integer", "string"]}}
            ),
            "metrics": obj(
                {
                    "service": obj({"enabled": BOOLEAN, "annotations": STRING_MAP}),
                    "dashboard": obj(
                        {"enabled": BOOLEAN, "labels": STRING_MAP, "annotations": STRING_MAP}
                    ),
                    "prometheusRule": obj({"enabled": BOOLEAN, "labels": STRING_MAP}),
                    **{
                        monitor: obj(
                            {
                                "enabled": BOOLEAN,
                                "interval": string(pattern="^([0-9]+(ms|s|m|h))+$"),
                                "labels": STRING_MAP,
                            }
                        )
                        for monitor in ("serviceMonitor", "podMonitor")
                    },
                },
            ),
            "priorityClassName": string(),
            "rbac": RBAC,
            "priorityClasses": PRIORITY_CLASSES,
            "nats": NATS,
            **{service: service_schema(service) for service in SERVICES},
            "reactions": REACTIONS,
        },
    }


def render() -> str:
    return json.dumps(build_schema(), indent=2) + "\n"


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="fail if the file is out of date")
    args = parser.parse_args(argv)
    text = render()
    if args.check:
        if SCHEMA_PATH.read_text() != text:
            print(f"{SCHEMA_PATH} is stale: run {Path(__file__).name}", file=sys.stderr)
            return 1
        return 0
    SCHEMA_PATH.write_text(text)
    print(f"wrote {SCHEMA_PATH}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
