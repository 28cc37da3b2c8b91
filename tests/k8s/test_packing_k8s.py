"""Compaction and overcommit on the real control plane: the `tideshift-packing` scheduler
profile packs, a scale-down marked by the executor frees a whole node that a large trainer then
takes, and the batch resources on Node status follow serving's usage.

Each test gets three fresh kwok nodes that only its own pods tolerate, so the shared nodes of
other tests are not touched (except the batch test, which removes what it advertised).
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from tests.fixtures.k8s import K8sCluster
from tests.k8s.cluster_objects import collection, create, wait_until
from tideshift.events import WorkloadRef
from tideshift.services.cluster.adapters.http import MERGE_PATCH, KubeHttp
from tideshift.services.cluster.core.overcommit import BATCH_CPU, BATCH_MEMORY, OvercommitConfig
from tideshift.services.cluster.kubernetes import KubernetesClusterPort
from tideshift.services.devcluster.nodes import NodeSpec
from tideshift.services.devcluster.scheduler_profile import PACKING_SCHEDULER
from tideshift.services.executor.batch_capacity import BatchAdvertiser
from tideshift.services.executor.compaction import mark_scale_down_victims

pytestmark = pytest.mark.k8s

WAIT = 90.0
GIB = 2**30
TAINT = "tideshift.io/packing-test"


@pytest.fixture
def pack_nodes(k8s_cluster: K8sCluster) -> Iterator[tuple[str, list[str]]]:
    """(group label, names) of three 4-core nodes that only this test's pods tolerate."""
    group = uuid.uuid4().hex[:6]
    specs = [
        NodeSpec(
            f"pack-{group}-{i}",
            cpu="4",
            memory="16Gi",
            labels={TAINT: group},
            taints=[{"key": TAINT, "value": group, "effect": "NoSchedule"}],
        )
        for i in range(3)
    ]
    k8s_cluster.create_nodes(specs)
    try:
        yield group, [spec.name for spec in specs]
    finally:
        k8s_cluster.delete_nodes([spec.name for spec in specs])


def placed(group: str, spec: dict[str, Any]) -> dict[str, Any]:
    """A pod spec confined to the test's nodes."""
    return {
        **spec,
        "nodeSelector": {TAINT: group},
        "tolerations": [{"key": TAINT, "operator": "Equal", "value": group}],
        "terminationGracePeriodSeconds": 0,
    }


def container(requests: Mapping[str, str]) -> dict[str, Any]:
    return {
        "name": "main",
        "image": "fake",
        "resources": {"requests": dict(requests), "limits": dict(requests)},
    }


def serving(name: str, group: str, replicas: int, *, spread: bool) -> dict[str, Any]:
    spec: dict[str, Any] = {"containers": [container({"cpu": "1"})]}
    if spread:  # the default scheduler's habit, made exact: 2 per node
        spec["topologySpreadConstraints"] = [
            {
                "maxSkew": 1,
                "topologyKey": "kubernetes.io/hostname",
                "whenUnsatisfiable": "DoNotSchedule",
                "labelSelector": {"matchLabels": {"app": name}},
            }
        ]
    else:
        spec["schedulerName"] = PACKING_SCHEDULER
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": {"app": name, "tideshift.io/role": "serving"}},
                "spec": placed(group, spec),
            },
        },
    }


def trainer(name: str, group: str, requests: Mapping[str, str]) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": {"tideshift.io/role": "training"}},
        "spec": placed(
            group, {"schedulerName": PACKING_SCHEDULER, "containers": [container(requests)]}
        ),
    }


def nodes_of(admin: KubeHttp, namespace: str, app: str) -> list[str] | None:
    """Nodes of the app's running, not terminating pods (None while any is unbound)."""
    pods = admin.get(
        f"/api/v1/namespaces/{namespace}/pods", query=[("labelSelector", f"app={app}")]
    )
    live = [p for p in pods["items"] if not p["metadata"].get("deletionTimestamp")]
    names = [p["spec"].get("nodeName") for p in live]
    return None if None in names else sorted(names)


def bound_node(admin: KubeHttp, namespace: str, pod: str) -> str | None:
    return admin.get(f"/api/v1/namespaces/{namespace}/pods/{pod}")["spec"].get("nodeName")


def test_packing_profile_piles_pods_onto_one_node(
    admin: KubeHttp, k8s_namespace: str, pack_nodes: tuple[str, list[str]]
) -> None:
    group, _ = pack_nodes
    create(
        admin, collection("Deployment", k8s_namespace), serving("packed", group, 4, spread=False)
    )

    def four_bound() -> list[str] | None:
        names = nodes_of(admin, k8s_namespace, "packed")
        return names if names is not None and len(names) == 4 else None

    names = wait_until(four_bound, timeout=WAIT, what="4 packed pods bound")
    assert len(set(names)) == 1, names  # 4 cores on one 4-core node, the others left whole


async def test_scale_down_frees_a_whole_node_and_a_large_trainer_takes_it(
    admin: KubeHttp,
    k8s_namespace: str,
    k8s_cluster: K8sCluster,
    pack_nodes: tuple[str, list[str]],
) -> None:
    group, node_names = pack_nodes
    deployments = collection("Deployment", k8s_namespace)
    await asyncio.to_thread(create, admin, deployments, serving("web", group, 6, spread=True))

    def spread_over_three() -> list[str] | None:
        names = nodes_of(admin, k8s_namespace, "web")
        return names if names is not None and len(names) == 6 else None

    names = await asyncio.to_thread(wait_until, spread_over_three, timeout=WAIT, what="6 pods")
    assert sorted(set(names)) == node_names  # 2 per node: no node has room for 4 cores
    port = await asyncio.to_thread(
        KubernetesClusterPort.from_kubeconfig, Path(k8s_cluster.kubeconfig)
    )
    try:
        writer = port.packing_writer()
        target = WorkloadRef(k8s_namespace, "Deployment", "web")
        marked = await mark_scale_down_victims(port, writer, target, 4)
        assert marked == 2
        await port.set_scale(target, 4)
    finally:
        await port.close()

    def four_left() -> list[str] | None:
        remaining = nodes_of(admin, k8s_namespace, "web")
        return remaining if remaining is not None and len(remaining) == 4 else None

    remaining = await asyncio.to_thread(wait_until, four_left, timeout=WAIT, what="4 pods left")
    freed = sorted(set(node_names) - set(remaining))
    assert len(freed) == 1, remaining  # the two victims shared a node: it is empty now
    pods = f"/api/v1/namespaces/{k8s_namespace}/pods"
    await asyncio.to_thread(create, admin, pods, trainer("big", group, {"cpu": "4"}))
    node = await asyncio.to_thread(
        wait_until,
        lambda: bound_node(admin, k8s_namespace, "big"),
        timeout=WAIT,
        what="the 4-core trainer bound",
    )
    assert node == freed[0]


class Usage:
    """Non-batch usage per node, set by the test (the port Prometheus fills in production)."""

    def __init__(self) -> None:
        self.used: dict[str, tuple[float, float]] = {}

    async def non_batch_usage(self) -> Mapping[str, tuple[float, float]]:
        return self.used


def batch_cpu(admin: KubeHttp, node: str) -> int | None:
    allocatable = admin.get(f"/api/v1/nodes/{node}")["status"].get("allocatable", {})
    return int(allocatable[BATCH_CPU]) if BATCH_CPU in allocatable else None


async def test_batch_resources_on_node_status_follow_serving_usage(
    admin: KubeHttp,
    k8s_namespace: str,
    k8s_cluster: K8sCluster,
    pack_nodes: tuple[str, list[str]],
) -> None:
    group, node_names = pack_nodes
    deployments = collection("Deployment", k8s_namespace)
    await asyncio.to_thread(create, admin, deployments, serving("web", group, 6, spread=True))

    def spread_over_three() -> list[str] | None:
        names = nodes_of(admin, k8s_namespace, "web")
        return names if names is not None and len(names) == 6 else None

    names = await asyncio.to_thread(wait_until, spread_over_three, timeout=WAIT, what="6 pods")
    assert sorted(set(names)) == node_names  # serving requests 2 cores on every node
    port = await asyncio.to_thread(
        KubernetesClusterPort.from_kubeconfig, Path(k8s_cluster.kubeconfig)
    )
    all_nodes = [node.name for node in await port.list_nodes()]
    usage = Usage()
    try:
        writer = port.packing_writer()
        advertiser = BatchAdvertiser(port, writer, usage, OvercommitConfig(margin=0.25))
        usage.used = {name: (0.5, 2 * GIB) for name in node_names}
        await advertiser.advertise_once()
        # serving's idle reservation, 2 - 0.5 = 1.5 cores per node, within the reclaimable
        # 4 x 0.75 - 0.5 = 2.5: the 2 cores no request holds are not lent
        assert await asyncio.to_thread(batch_cpu, admin, node_names[0]) == 1500
        pods = f"/api/v1/namespaces/{k8s_namespace}/pods"
        await asyncio.to_thread(
            create, admin, pods, trainer("borrower", group, {BATCH_CPU: "1000"})
        )
        node = await asyncio.to_thread(
            wait_until,
            lambda: bound_node(admin, k8s_namespace, "borrower"),
            timeout=WAIT,
            what="a trainer on batch-cpu bound",
        )
        assert node in node_names
        # serving gets busy on the first node: what it lends shrinks with it
        usage.used[node_names[0]] = (1.5, 2 * GIB)
        await advertiser.advertise_once()
        assert await asyncio.to_thread(batch_cpu, admin, node_names[0]) == 500
        assert await asyncio.to_thread(batch_cpu, admin, node_names[1]) == 1500
    finally:
        await port.close()
        # shared nodes got 0 (their usage is unknown here): take the resources off again
        removal = {name: None for name in (BATCH_CPU, BATCH_MEMORY)}
        for name in set(all_nodes) - set(node_names):
            await asyncio.to_thread(
                admin.json,
                "PATCH",
                f"/api/v1/nodes/{name}/status",
                body={"status": {"capacity": removal, "allocatable": removal}},
                content_type=MERGE_PATCH,
            )
