"""The Helm chart in a real control plane: install, every Deployment Available on kwok nodes,
least-privilege ServiceAccounts, upgrade and uninstall leaving nothing behind."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client, config

from tests.unit.chart.chart_support import CHART, SERVICES, rbac_file_rules, run_helm, values_args
from tideshift.services.devcluster.processes import wait_for

pytestmark = pytest.mark.k8s

WAIT = 120.0
REACTION_SCRIPT = "print('a reaction')\n"
INSTANCE_LABEL = "app.kubernetes.io/instance"


def helm(k8s_cluster: Any, *args: str) -> str:
    return run_helm(*args, env={"KUBECONFIG": str(k8s_cluster.kubeconfig)}).stdout


def static_volume(api: Any, storage_class: str) -> str:
    """A PersistentVolume the bundled NATS claim can bind to (kwok clusters provision none)."""
    name = f"pv-{storage_class}"
    client.CoreV1Api(api).create_persistent_volume(
        {
            "apiVersion": "v1",
            "kind": "PersistentVolume",
            "metadata": {"name": name, "labels": {"tideshift.io/test": "1"}},
            "spec": {
                "capacity": {"storage": "1Gi"},
                "accessModes": ["ReadWriteOnce"],
                "storageClassName": storage_class,
                "persistentVolumeReclaimPolicy": "Retain",
                "hostPath": {"path": f"/tmp/{name}"},
            },
        }
    )
    return name


def install_values(storage_class: str, priority_prefix: str) -> dict[str, Any]:
    return {
        "nats": {
            "bundled": {
                "persistence": {
                    "storageClassName": storage_class,
                    "size": "1Gi",
                    "whenDeleted": "Delete",
                }
            }
        },
        "priorityClasses": {
            "create": True,
            "serving": {"name": f"{priority_prefix}-serving"},
            "training": {"name": f"{priority_prefix}-training"},
        },
        "reactions": {"enabled": True, "script": REACTION_SCRIPT},
    }


def deployments_available(api: Any, namespace: str, release: str) -> dict[str, bool]:
    apps = client.AppsV1Api(api)
    found = apps.list_namespaced_deployment(namespace, label_selector=f"{INSTANCE_LABEL}={release}")
    available = {}
    for deployment in found.items:
        conditions = {c.type: c.status for c in deployment.status.conditions or []}
        available[deployment.metadata.name] = (
            conditions.get("Available") == "True"
            and (deployment.status.available_replicas or 0) == deployment.spec.replicas
            and deployment.status.observed_generation == deployment.metadata.generation
        )
    return available


def release_objects(api: Any, namespace: str, release: str) -> list[str]:
    """Everything labelled with the release, namespaced and cluster-wide, plus Helm's record."""
    selector = f"{INSTANCE_LABEL}={release}"
    core, apps = client.CoreV1Api(api), client.AppsV1Api(api)
    rbac, policy = client.RbacAuthorizationV1Api(api), client.PolicyV1Api(api)
    scheduling = client.SchedulingV1Api(api)
    listings: dict[str, Callable[[], Any]] = {
        "Deployment": lambda: apps.list_namespaced_deployment(namespace, label_selector=selector),
        "StatefulSet": lambda: apps.list_namespaced_stateful_set(
            namespace, label_selector=selector
        ),
        "ReplicaSet": lambda: apps.list_namespaced_replica_set(namespace, label_selector=selector),
        "Pod": lambda: core.list_namespaced_pod(namespace, label_selector=selector),
        "Service": lambda: core.list_namespaced_service(namespace, label_selector=selector),
        "ConfigMap": lambda: core.list_namespaced_config_map(namespace, label_selector=selector),
        "Secret": lambda: core.list_namespaced_secret(namespace, label_selector=selector),
        "ServiceAccount": lambda: core.list_namespaced_service_account(
            namespace, label_selector=selector
        ),
        "PersistentVolumeClaim": lambda: core.list_namespaced_persistent_volume_claim(
            namespace, label_selector=selector
        ),
        "PodDisruptionBudget": lambda: policy.list_namespaced_pod_disruption_budget(
            namespace, label_selector=selector
        ),
        "ClusterRole": lambda: rbac.list_cluster_role(label_selector=selector),
        "ClusterRoleBinding": lambda: rbac.list_cluster_role_binding(label_selector=selector),
        "PriorityClass": lambda: scheduling.list_priority_class(label_selector=selector),
        "HelmRelease": lambda: core.list_namespaced_secret(
            namespace, label_selector=f"owner=helm,name={release}"
        ),
    }
    return [
        f"{kind}/{item.metadata.name}"
        for kind, listing in listings.items()
        for item in listing().items
    ]


@pytest.fixture
def api(k8s_cluster: Any) -> Iterator[Any]:
    with k8s_cluster.api_client() as api_client:
        yield api_client


@pytest.fixture
def release(k8s_cluster: Any, api: Any, k8s_namespace: str) -> Iterator[dict[str, str]]:
    """A unique release name and the cluster-wide names it may create; cleaned up after."""
    token = uuid.uuid4().hex[:6]
    names = {
        "release": f"ts-{token}",
        "namespace": k8s_namespace,
        "storage_class": f"tideshift-test-{token}",
        "priority_prefix": f"tideshift-{token}",
    }
    names["volume"] = static_volume(api, names["storage_class"])
    try:
        yield names
    finally:
        run_helm(
            "uninstall",
            names["release"],
            "--namespace",
            k8s_namespace,
            "--ignore-not-found",
            env={"KUBECONFIG": str(k8s_cluster.kubeconfig)},
            check=False,
        )
        client.CoreV1Api(api).delete_persistent_volume(names["volume"])


def test_install_upgrade_uninstall_leaves_nothing_behind(
    k8s_cluster: Any, api: Any, release: dict[str, str], tmp_path: Path
) -> None:
    name, namespace = release["release"], release["namespace"]
    values = install_values(release["storage_class"], release["priority_prefix"])
    installed = helm(
        k8s_cluster,
        "install",
        name,
        str(CHART),
        "--namespace",
        namespace,
        "--wait",
        "--timeout",
        f"{WAIT:.0f}s",
        *values_args(values, tmp_path),
    )

    assert "tideshift events tail" in installed.split("NOTES:", 1)[1], "NOTES are printed"

    # Every Deployment Available with all its replicas, each pod on a kwok node.
    wait_for(
        lambda: all(deployments_available(api, namespace, name).values()),
        timeout=WAIT,
        what="every Deployment of the release to be Available",
    )
    available = deployments_available(api, namespace, name)
    expected = {f"{name}-tideshift-{service}" for service in (*SERVICES, "reactions")}
    assert set(available) == expected
    core = client.CoreV1Api(api)
    pods = core.list_namespaced_pod(namespace, label_selector=f"{INSTANCE_LABEL}={name}").items
    replicas = {
        "watcher": 1,
        "predictor": 1,
        "planner": 2,
        "executor": 2,
        "reactions": 1,
        "nats": 1,
        # the provisioning Job's pod (it creates the streams and buckets, then completes)
        "nats-provision": 1,
    }
    assert len(pods) == sum(replicas.values())
    assert all(pod.spec.node_name.startswith("kwok-") for pod in pods)
    assert all(pod.status.phase == "Running" for pod in pods)
    (claim,) = core.list_namespaced_persistent_volume_claim(namespace).items
    assert claim.status.phase == "Bound" and claim.spec.volume_name == release["volume"]
    priority = client.SchedulingV1Api(api)
    serving = priority.read_priority_class(f"{release['priority_prefix']}-serving")
    training = priority.read_priority_class(f"{release['priority_prefix']}-training")
    assert serving.value > training.value

    # Upgrade: drop the reaction hook and the PriorityClasses, grow the executor.
    values["reactions"] = {"enabled": False}
    values["priorityClasses"]["create"] = False
    values["executor"] = {"replicas": 3}
    helm(
        k8s_cluster,
        "upgrade",
        name,
        str(CHART),
        "--namespace",
        namespace,
        "--wait",
        "--timeout",
        f"{WAIT:.0f}s",
        *values_args(values, tmp_path),
    )
    wait_for(
        lambda: (
            all(deployments_available(api, namespace, name).values())
            and not [o for o in release_objects(api, namespace, name) if "reactions" in o]
        ),
        timeout=WAIT,
        what="the upgraded release to settle",
    )
    remaining = release_objects(api, namespace, name)
    assert not [obj for obj in remaining if "reactions" in obj], remaining
    assert not [obj for obj in remaining if obj.startswith("PriorityClass/")], remaining
    executor = client.AppsV1Api(api).read_namespaced_deployment(
        f"{name}-tideshift-executor", namespace
    )
    assert executor.status.available_replicas == 3

    helm(k8s_cluster, "uninstall", name, "--namespace", namespace, "--wait")
    wait_for(
        lambda: not release_objects(api, namespace, name),
        timeout=WAIT,
        what=f"every object of release {name} to be gone",
    )
    assert release_objects(api, namespace, name) == []
    assert core.list_namespaced_persistent_volume_claim(namespace).items == []


# ---- least privilege, checked with each ServiceAccount's own token ------------------------


def can(api: Any, verb: str, resource: str, *, group: str = "", namespace: str = "") -> bool:
    """SelfSubjectAccessReview: may the caller (whose token `api` carries) do this?"""
    resource_name, _, subresource = resource.partition("/")
    review = client.AuthorizationV1Api(api).create_self_subject_access_review(
        {
            "apiVersion": "authorization.k8s.io/v1",
            "kind": "SelfSubjectAccessReview",
            "spec": {
                "resourceAttributes": {
                    "verb": verb,
                    "group": group,
                    "resource": resource_name,
                    "subresource": subresource,
                    "namespace": namespace,
                }
            },
        }
    )
    return bool(review.status.allowed)


@pytest.fixture(scope="module")
def rbac_release(
    k8s_cluster: Any, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, str]]:
    """One installed release for the RBAC checks (NATS without a claim: not under test here)."""
    token = uuid.uuid4().hex[:6]
    namespace, name = f"t-helm-rbac-{token}", f"ts-{token}"
    kube_env = {"KUBECONFIG": str(k8s_cluster.kubeconfig)}
    with k8s_cluster.api_client() as api_client:
        client.CoreV1Api(api_client).create_namespace({"metadata": {"name": namespace}})
    values = {
        "nats": {"bundled": {"persistence": {"enabled": False}}},
        "reactions": {"enabled": True, "script": REACTION_SCRIPT},
    }
    path = tmp_path_factory.mktemp("rbac") / "values.yaml"
    path.write_text(yaml.safe_dump(values))
    run_helm(
        "install",
        name,
        str(CHART),
        *("-n", namespace, "--values", str(path), "--wait", "--timeout", f"{WAIT:.0f}s"),
        env=kube_env,
    )
    try:
        yield {"namespace": namespace, "release": name}
    finally:
        run_helm("uninstall", name, "-n", namespace, env=kube_env, check=False)
        with k8s_cluster.api_client() as api_client:
            client.CoreV1Api(api_client).delete_namespace(namespace)


def service_account_api(
    k8s_cluster: Any, namespace: str, service_account: str, tmp_path: Path
) -> Any:
    kubeconfig = k8s_cluster.service_account_kubeconfig(
        namespace, service_account, tmp_path / f"{service_account}.kubeconfig", create=False
    )
    return config.new_client_from_config(config_file=str(kubeconfig))


@pytest.mark.parametrize("service", ["watcher", "executor"])
def test_kubernetes_services_are_allowed_every_rule_of_their_role(
    k8s_cluster: Any, rbac_release: dict[str, str], service: str, tmp_path: Path
) -> None:
    rules = rbac_file_rules()[service]
    account = f"{rbac_release['release']}-tideshift-{service}"
    with service_account_api(k8s_cluster, rbac_release["namespace"], account, tmp_path) as api:
        for rule in rules:
            for group in rule["apiGroups"]:
                for resource in rule["resources"]:
                    for verb in rule["verbs"]:
                        # Cluster-wide: the services act on workloads in every namespace.
                        assert can(api, verb, resource, group=group), (service, verb, resource)


DENIED = [
    # verb, resource, group: nobody may do these
    ("get", "secrets", ""),
    ("list", "secrets", ""),
    ("create", "pods", ""),
    ("delete", "pods", ""),
    ("delete", "deployments", "apps"),
    ("create", "clusterrolebindings", "rbac.authorization.k8s.io"),
    ("get", "configmaps", ""),
]


@pytest.mark.parametrize("service", [*SERVICES, "reactions"])
def test_no_service_account_can_read_secrets_or_change_workloads(
    k8s_cluster: Any, rbac_release: dict[str, str], service: str, tmp_path: Path
) -> None:
    namespace = rbac_release["namespace"]
    account = f"{rbac_release['release']}-tideshift-{service}"
    with service_account_api(k8s_cluster, namespace, account, tmp_path) as api:
        for verb, resource, group in DENIED:
            for where in (namespace, ""):
                assert not can(api, verb, resource, group=group, namespace=where), (
                    service,
                    verb,
                    resource,
                    where or "cluster-wide",
                )
        if service not in {"watcher", "executor"}:
            # No Kubernetes rights at all: not even reading pods.
            assert not can(api, "list", "pods")
            assert not can(api, "get", "deployments/scale", group="apps", namespace=namespace)


def test_watcher_token_lists_pods_but_reading_a_secret_is_forbidden(
    k8s_cluster: Any, rbac_release: dict[str, str], tmp_path: Path
) -> None:
    namespace = rbac_release["namespace"]
    account = f"{rbac_release['release']}-tideshift-watcher"
    with service_account_api(k8s_cluster, namespace, account, tmp_path) as api:
        core = client.CoreV1Api(api)
        pods = core.list_pod_for_all_namespaces(
            label_selector=f"{INSTANCE_LABEL}={rbac_release['release']}"
        )
        assert pods.items, "the watcher sees the release's own pods"
        with pytest.raises(client.ApiException) as denied:
            core.read_namespaced_secret(f"{rbac_release['release']}-tideshift-nats", namespace)
    assert denied.value.status == 403
