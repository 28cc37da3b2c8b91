"""A port that follows its listings (`follow=True`, the executor's) on the real control plane:
after the first listing, nodes and pods come from informer caches kept current by a watch,
not from a full list per call; without the right to watch, each listing lists afresh."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from kubernetes.client.exceptions import ApiException

from tests.k8s.cluster_objects import (
    bind_cluster_role,
    create,
    pod_template,
)
from tideshift.services.cluster.adapters.http import KubeHttp
from tideshift.services.cluster.informer import RELISTS
from tideshift.services.cluster.kubernetes import KubernetesClusterPort

pytestmark = pytest.mark.k8s
WAIT = 60.0


def pod(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": pod_template({})["spec"],
    }


def relists(resource: str) -> float:
    return float(RELISTS.labels(resource, "list")._value.get())


async def eventually(check: Callable[[], Awaitable[bool]], what: str) -> None:
    deadline = time.monotonic() + WAIT
    while not await check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {WAIT:.0f}s waiting for {what}")
        await asyncio.sleep(0.05)


async def pod_names(port: KubernetesClusterPort) -> set[str]:
    return {pod.name for pod in await port.list_pods()}


async def test_a_following_port_lists_from_caches_its_watch_keeps_current(
    k8s_cluster: Any, admin: KubeHttp, k8s_namespace: str
) -> None:
    pods = f"/api/v1/namespaces/{k8s_namespace}/pods"
    await asyncio.to_thread(create, admin, pods, pod("before"))
    port = await asyncio.to_thread(
        KubernetesClusterPort.from_kubeconfig,
        Path(k8s_cluster.kubeconfig),
        namespace=k8s_namespace,
        follow=True,
    )
    try:
        assert await pod_names(port) == {"before"}  # the first listing lists
        assert await port.list_nodes()
        listed = relists("pods"), relists("nodes")

        async def followed() -> bool:
            return all(informer.watching for informer in (port.nodes, *port.pods.members))

        await eventually(followed, "both followers watching")
        await asyncio.to_thread(create, admin, pods, pod("after"))

        async def both() -> bool:
            return await pod_names(port) == {"before", "after"}

        await eventually(both, "the new pod in the listing")
        await asyncio.to_thread(
            admin.json, "DELETE", f"{pods}/before", body={"gracePeriodSeconds": 0}
        )

        async def only_after() -> bool:
            return await pod_names(port) == {"after"}

        await eventually(only_after, "the deleted pod gone from the listing")
        await port.list_nodes()
        # Every answer since the first came from the followed caches: nothing was listed.
        assert (relists("pods"), relists("nodes")) == listed
        with pytest.raises(RuntimeError, match="not watched"):
            await anext(port.watch())
    finally:
        await port.close()
    assert not any(i.watching for i in (port.nodes, *port.pods.members))


async def test_without_the_right_to_watch_each_listing_lists_afresh(
    admin: KubeHttp, k8s_namespace: str, k8s_service_account_kubeconfig: Callable[..., Path]
) -> None:
    # A role that may list pods and nodes but not watch them (the chart's executor role may
    # watch both: an operator's narrower role is what this covers).
    role = f"list-only-{k8s_namespace}"
    create(
        admin,
        "/apis/rbac.authorization.k8s.io/v1/clusterroles",
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRole",
            "metadata": {"name": role},
            "rules": [{"apiGroups": [""], "resources": ["pods", "nodes"], "verbs": ["list"]}],
        },
    )
    kubeconfig = k8s_service_account_kubeconfig(k8s_namespace, "list-only")
    bind_cluster_role(admin, role, k8s_namespace, "list-only")
    pods = f"/api/v1/namespaces/{k8s_namespace}/pods"
    port = await asyncio.to_thread(
        KubernetesClusterPort.from_kubeconfig, kubeconfig, namespace=k8s_namespace, follow=True
    )
    try:

        async def granted() -> bool:  # the RoleBinding takes a moment to apply
            try:
                return await pod_names(port) == set()
            except ApiException as error:
                if error.status != 403:
                    raise
                return False

        await eventually(granted, "the executor's role to apply")
        await asyncio.to_thread(create, admin, pods, pod("new"))
        before = relists("pods")
        assert await pod_names(port) == {"new"}  # at once: listed, not waited for
        assert relists("pods") == before + 1
    finally:
        await port.close()
