"""Observe first, then act, with Helm on the real control plane: a release installed with
`executor.config.mode=observe` runs its executor in observe mode; one `helm upgrade
--reuse-values --set executor.config.mode=act` rolls the executor to act mode and changes
nothing else of its settings. (What each mode does to a target: test_operator_events.py.)"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client

from tests.unit.chart.chart_support import CHART, run_helm

pytestmark = pytest.mark.k8s


def executor_env(api: Any, namespace: str, release: str) -> dict[str, str]:
    deployment = client.AppsV1Api(api).read_namespaced_deployment(
        f"{release}-tideshift-executor", namespace
    )
    (container,) = deployment.spec.template.spec.containers
    return {item.name: item.value for item in container.env or [] if item.value is not None}


@pytest.fixture
def release(k8s_cluster: Any, k8s_namespace: str) -> Iterator[str]:
    name = f"ts-{uuid.uuid4().hex[:6]}"
    try:
        yield name
    finally:
        run_helm(
            "uninstall", name, "--namespace", k8s_namespace, "--ignore-not-found",
            env={"KUBECONFIG": str(k8s_cluster.kubeconfig)}, check=False,
        )  # fmt: skip


def test_one_upgrade_switches_observe_to_act(
    k8s_cluster: Any, k8s_namespace: str, release: str
) -> None:
    kube = {"KUBECONFIG": str(k8s_cluster.kubeconfig)}
    common = [str(CHART), "--namespace", k8s_namespace]
    run_helm(
        "install", release, *common, "--set", "executor.config.mode=observe",
        "--set", "nats.bundled.persistence.enabled=false", env=kube,
    )  # fmt: skip
    with k8s_cluster.api_client() as api:
        observing = executor_env(api, k8s_namespace, release)
        assert observing["TIDESHIFT_MODE"] == "observe"
        run_helm(
            "upgrade", release, *common, "--reuse-values",
            "--set", "executor.config.mode=act", env=kube,
        )  # fmt: skip
        # helm upgrade returns once the apiserver holds the new Deployment.
        acting = executor_env(api, k8s_namespace, release)
        changed = {k for k in observing.keys() | acting.keys() if observing.get(k) != acting.get(k)}
        assert changed == {"TIDESHIFT_MODE"}
