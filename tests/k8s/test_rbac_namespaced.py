"""Namespaced RBAC (`rbac.namespaced`, issue 25) on the real control plane: the chart's RBAC
objects are applied as `helm template` renders them, and the apiserver's own authorizer
(SubjectAccessReview, as `kubectl auth can-i --as` asks it) says what each ServiceAccount may
do: scale and annotate only in the listed namespaces; read nodes, and the executor list pods,
cluster-wide; the settings follow the namespaces; and the watcher, run with those Roles only,
announces objects of the listed namespaces and never one outside."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes.client import ApiException

from tests.k8s.cluster_objects import collection, create, deployment, wait_until
from tests.unit.chart.chart_support import CHART, HelmFailed, run_helm
from tideshift.services.cluster.adapters.http import KubeHttp
from tideshift.services.cluster.kubernetes import KubernetesClusterPort
from tideshift.services.cluster.port import Workload

RBAC_KINDS = {
    "ServiceAccount": "/api/v1/namespaces/{namespace}/serviceaccounts",
    "Role": "/apis/rbac.authorization.k8s.io/v1/namespaces/{namespace}/roles",
    "RoleBinding": "/apis/rbac.authorization.k8s.io/v1/namespaces/{namespace}/rolebindings",
    "ClusterRole": "/apis/rbac.authorization.k8s.io/v1/clusterroles",
    "ClusterRoleBinding": "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings",
}


def render(release_namespace: str, namespaces: list[str]) -> list[dict[str, Any]]:
    listed = "{" + ",".join(namespaces) + "}"
    out = run_helm(
        "template",
        "ts",
        str(CHART),
        "--namespace",
        release_namespace,
        "--set",
        "rbac.namespaced=true",
        "--set",
        f"rbac.namespaces={listed}",
    ).stdout
    return [doc for doc in yaml.safe_load_all(out) if doc]


def env_of(docs: list[dict[str, Any]], service: str) -> dict[str, str]:
    deployment = next(
        d for d in docs if d["kind"] == "Deployment" and d["metadata"]["name"] == f"ts-{service}"
    )
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    return {item["name"]: item.get("value") for item in container["env"]}


@pytest.fixture
def namespaces(admin: KubeHttp) -> Iterator[list[str]]:
    """Three fresh namespaces: two to list in `rbac.namespaces`, one left out."""
    names = [f"rbac-{label}-{uuid.uuid4().hex[:6]}" for label in ("a", "b", "out")]
    for name in names:
        create(admin, "/api/v1/namespaces", {"metadata": {"name": name}})
    yield names
    for name in names:
        _delete(admin, f"/api/v1/namespaces/{name}")


def _delete(admin: KubeHttp, path: str) -> None:
    try:
        admin.json("DELETE", path)
    except ApiException as error:
        if error.status != 404:
            raise


@pytest.fixture
def applied(admin: KubeHttp) -> Iterator[list[dict[str, Any]]]:
    """Apply the RBAC objects of a render (append it); cluster-wide ones removed after."""
    renders: list[dict[str, Any]] = []
    yield renders
    for doc in renders:
        if doc["kind"].startswith("Cluster"):
            _delete(admin, RBAC_KINDS[doc["kind"]] + "/" + doc["metadata"]["name"])


def apply(admin: KubeHttp, docs: list[dict[str, Any]], applied: list[dict[str, Any]]) -> None:
    for doc in docs:
        if doc["kind"] in RBAC_KINDS:
            namespace = doc["metadata"].get("namespace", "")
            create(admin, RBAC_KINDS[doc["kind"]].format(namespace=namespace), doc)
            applied.append(doc)


def may(
    admin: KubeHttp,
    account: str,
    verb: str,
    resource: str,
    *,
    namespace: str = "",
    group: str = "",
    subresource: str = "",
) -> bool:
    """`kubectl auth can-i <verb> <resource> --as system:serviceaccount:...`."""
    review = admin.json(
        "POST",
        "/apis/authorization.k8s.io/v1/subjectaccessreviews",
        body={
            "apiVersion": "authorization.k8s.io/v1",
            "kind": "SubjectAccessReview",
            "spec": {
                "user": account,
                "resourceAttributes": {
                    "namespace": namespace,
                    "group": group,
                    "resource": resource,
                    "subresource": subresource,
                    "verb": verb,
                },
            },
        },
    )
    return bool(review.get("status", {}).get("allowed"))


def granted(admin: KubeHttp, account: str, verb: str, resource: str, **where: str) -> bool:
    """`may`, once the authorizer has learnt the new roles and bindings (it follows them by a
    watch, so a grant shows moments after it is created); False after 30 s."""
    try:
        return bool(
            wait_until(
                lambda: may(admin, account, verb, resource, **where),
                timeout=30,
                what=f"{account} may {verb} {resource}",
            )
        )
    except TimeoutError:
        return False


def test_one_namespace_confines_the_executor_and_the_watcher_to_it(
    admin: KubeHttp,
    k8s_namespace: str,
    namespaces: list[str],
    applied: list[dict[str, Any]],
) -> None:
    team, _, outside = namespaces
    docs = render(k8s_namespace, [team])
    apply(admin, docs, applied)
    executor = f"system:serviceaccount:{k8s_namespace}:ts-tideshift-executor"
    watcher = f"system:serviceaccount:{k8s_namespace}:ts-tideshift-watcher"

    scale = {"group": "apps", "subresource": "scale"}
    assert granted(admin, executor, "update", "deployments", namespace=team, **scale)
    assert not may(admin, executor, "update", "deployments", namespace=outside, **scale)
    assert granted(admin, executor, "patch", "jobs", namespace=team, group="batch")
    assert not may(admin, executor, "patch", "jobs", namespace=outside, group="batch")
    assert granted(admin, executor, "patch", "pods", namespace=team)
    assert not may(admin, executor, "patch", "pods", namespace=outside)
    assert not may(admin, executor, "create", "events", namespace=outside)
    # Cluster-wide, and only these: nodes, their status, and listing pods (compaction).
    assert granted(admin, executor, "list", "nodes")
    assert granted(admin, executor, "patch", "nodes", subresource="status")
    assert granted(admin, executor, "list", "pods")
    assert not may(admin, executor, "get", "pods", namespace=outside)
    assert not may(admin, executor, "patch", "nodes")

    workloads = {"group": "apps"}
    assert granted(admin, watcher, "watch", "deployments", namespace=team, **workloads)
    assert not may(admin, watcher, "watch", "deployments", namespace=outside, **workloads)
    assert not may(admin, watcher, "list", "pods")
    assert granted(admin, watcher, "list", "pods", namespace=team)
    assert granted(admin, watcher, "watch", "nodes")
    assert granted(admin, watcher, "create", "events", namespace=team)
    assert not may(admin, watcher, "create", "events", namespace=outside)

    assert env_of(docs, "tideshift-executor")["TIDESHIFT_ALLOWED_NAMESPACES"] == f'["{team}"]'
    assert env_of(docs, "tideshift-watcher")["TIDESHIFT_NAMESPACES"] == f'["{team}"]'


def test_several_namespaces_confine_the_watcher_to_them(
    admin: KubeHttp,
    k8s_namespace: str,
    namespaces: list[str],
    applied: list[dict[str, Any]],
) -> None:
    first, second, outside = namespaces
    docs = render(k8s_namespace, [first, second])
    apply(admin, docs, applied)
    executor = f"system:serviceaccount:{k8s_namespace}:ts-tideshift-executor"
    watcher = f"system:serviceaccount:{k8s_namespace}:ts-tideshift-watcher"

    scale = {"group": "apps", "subresource": "scale"}
    for listed in (first, second):
        assert granted(admin, executor, "update", "deployments", namespace=listed, **scale)
        assert granted(admin, watcher, "create", "events", namespace=listed)
    assert not may(admin, executor, "update", "deployments", namespace=outside, **scale)
    # The watcher watches each listed namespace on its own: nothing outside, nothing
    # cluster-wide but nodes.
    for listed in (first, second):
        assert granted(admin, watcher, "watch", "deployments", namespace=listed, group="apps")
        assert granted(admin, watcher, "list", "pods", namespace=listed)
    assert not may(admin, watcher, "watch", "deployments", namespace=outside, group="apps")
    assert not may(admin, watcher, "list", "pods")
    assert granted(admin, watcher, "watch", "nodes")
    assert not may(admin, watcher, "create", "events", namespace=outside)
    assert not may(admin, watcher, "patch", "events", namespace=outside)

    assert env_of(docs, "tideshift-executor")["TIDESHIFT_ALLOWED_NAMESPACES"] == (
        f'["{first}","{second}"]'
    )
    assert env_of(docs, "tideshift-watcher")["TIDESHIFT_NAMESPACES"] == f'["{first}","{second}"]'


def labelled(namespace: str, name: str) -> tuple[str, dict[str, Any]]:
    """A Deployment that joined Tideshift: the watcher announces it."""
    obj = deployment(name, 1)
    obj["metadata"]["labels"] = {"tideshift.io/role": "serving"}
    return collection("Deployment", namespace), obj


def test_the_watcher_with_its_roles_announces_the_listed_namespaces_only(
    admin: KubeHttp,
    k8s_namespace: str,
    namespaces: list[str],
    applied: list[dict[str, Any]],
    k8s_service_account_kubeconfig: Callable[..., Path],
) -> None:
    """Run as the chart's watcher ServiceAccount, with its rendered Roles and nothing else:
    the port lists and watches each listed namespace; an object outside is never seen."""
    first, second, outside = namespaces
    docs = render(k8s_namespace, [first, second])
    apply(admin, docs, applied)
    kubeconfig = k8s_service_account_kubeconfig(k8s_namespace, "ts-tideshift-watcher")
    create(admin, *labelled(outside, "outside-before"))
    create(admin, *labelled(first, "inside-before"))
    port = KubernetesClusterPort.from_kubeconfig(kubeconfig, namespace=[first, second])

    def listed() -> list[str] | None:
        try:
            return [w.ref.name for w in asyncio.run(port.list_workloads())]
        except ApiException as error:
            if error.status == 403:
                return None  # the new Roles are not in the authorizer's cache yet
            raise

    assert wait_until(listed, timeout=30, what="the watcher's Roles") == ["inside-before"]

    async def announced() -> list[tuple[str, str]]:
        seen: list[tuple[str, str]] = []
        changes = port.watch()
        try:
            create(admin, *labelled(outside, "outside-after"))
            create(admin, *labelled(second, "inside-after"))
            async with asyncio.timeout(60):
                async for change in changes:
                    if isinstance(change.obj, Workload):
                        seen.append((change.obj.ref.namespace, change.obj.ref.name))
                    if (second, "inside-after") in seen:
                        return seen
        finally:
            await changes.aclose()
        return seen

    seen = asyncio.run(announced())
    assert (second, "inside-after") in seen
    assert all(namespace != outside for namespace, _ in seen), seen
    # Every watch is up and its cache full: what the port holds is what it may announce.
    assert sorted(w.ref.name for w in asyncio.run(port.list_workloads())) == [
        "inside-after",
        "inside-before",
    ]
    asyncio.run(port.close())


def test_namespaced_without_namespaces_is_refused_naming_the_value() -> None:
    with pytest.raises(HelmFailed, match=r"rbac\.namespaces: expected at least one namespace"):
        run_helm("template", "ts", str(CHART), "--set", "rbac.namespaced=true")
