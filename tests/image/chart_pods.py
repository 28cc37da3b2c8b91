"""A rendered chart Deployment's container, resolved the way the kubelet would resolve it.

Shared by the tests that run the chart's services as processes (tests/k8s/test_helm_services.py)
and as containers of the image (tests/image/test_image_services.py).
"""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client

from tests.unit.chart.chart_support import run_helm


def installed_deployments(kubeconfig: Path, release: str, namespace: str) -> dict[str, Any]:
    """The release's Deployments, by component (watcher, predictor, ...)."""
    manifest = run_helm(
        "get", "manifest", release, "-n", namespace, env={"KUBECONFIG": str(kubeconfig)}
    ).stdout
    return {
        doc["metadata"]["labels"]["app.kubernetes.io/component"]: doc
        for doc in yaml.safe_load_all(manifest)
        if doc and doc["kind"] == "Deployment"
    }


def container_environment(
    pod_name: str, container: dict[str, Any], *, api: Any, namespace: str
) -> dict[str, str]:
    """The container's `env`, with Secret references read and the pod's name filled in."""
    core = client.CoreV1Api(api)
    env: dict[str, str] = {}
    for item in container["env"]:
        if "value" in item:
            env[item["name"]] = item["value"]
        elif "secretKeyRef" in item["valueFrom"]:
            ref = item["valueFrom"]["secretKeyRef"]
            secret = core.read_namespaced_secret(ref["name"], namespace)
            env[item["name"]] = base64.b64decode(secret.data[ref["key"]]).decode()
        else:
            assert item["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
            env[item["name"]] = pod_name
    return env
