"""One behavioural suite for every `ClusterPort` backend: the simulator and real Kubernetes.

Each backend gets a small harness that creates nodes and Deployments its own way (the sim
in-process, Kubernetes through the apiserver, with the controller-manager, scheduler and
kwok doing the rest); the assertions are the same.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any, Protocol

import pytest

from tideshift.services.cluster.port import (
    ClusterChange,
    ClusterPort,
    Node,
    Pod,
    Resources,
    WorkloadRef,
)
from tideshift.services.cluster.sim import SimCluster, SimClusterPort, SimWorkload

WAIT = 60.0


class Harness(Protocol):
    port: ClusterPort
    namespace: str

    async def add_node(self, name: str, cpu: float) -> None: ...
    async def remove_node(self, name: str) -> None: ...
    async def create_deployment(
        self, name: str, replicas: int, *, low: int = 0, high: int | None = None
    ) -> WorkloadRef: ...
    async def settle(self) -> None:
        """Let controllers act (the sim advances its clock; Kubernetes runs by itself)."""


class SimHarness:
    def __init__(self) -> None:
        self.cluster = SimCluster(now=0.0)
        self.port: ClusterPort = SimClusterPort(self.cluster)
        self.namespace = "suite"

    async def add_node(self, name: str, cpu: float) -> None:
        self.cluster.add_node(Node(name, Resources(cpu=cpu, memory=64 * 2**30)))

    async def remove_node(self, name: str) -> None:
        self.cluster.remove_node(name)

    async def create_deployment(
        self, name: str, replicas: int, *, low: int = 0, high: int | None = None
    ) -> WorkloadRef:
        ref = WorkloadRef(self.namespace, "Deployment", name)
        self.cluster.add_workload(
            SimWorkload(
                ref=ref,
                kind="Deployment",
                role="serving",
                pod_requests=Resources(cpu=0.1),
                replicas=replicas,
                min_replicas=low,
                max_replicas=high,
            )
        )
        return ref

    async def settle(self) -> None:
        self.cluster.advance(1.0)


class KubernetesHarness:
    def __init__(self, k8s_cluster: Any, namespace: str) -> None:
        from tideshift.services.cluster.adapters.http import KubeHttp
        from tideshift.services.cluster.kubernetes import KubernetesClusterPort

        self.k8s = k8s_cluster
        self.namespace = namespace
        self.admin = k8s_cluster.api_client()
        self.http = KubeHttp(self.admin)
        self.port: ClusterPort = KubernetesClusterPort(
            k8s_cluster.api_client(), namespace=namespace
        )
        self.nodes: set[str] = set()

    async def add_node(self, name: str, cpu: float) -> None:
        from tideshift.services.devcluster.nodes import NodeSpec

        spec = NodeSpec(name=name, cpu=str(int(cpu)), memory="64Gi")
        self.nodes.add(name)
        await asyncio.to_thread(self.k8s.create_nodes, [spec])

    async def remove_node(self, name: str) -> None:
        self.nodes.discard(name)
        await asyncio.to_thread(self.k8s.delete_nodes, [name])

    async def create_deployment(
        self, name: str, replicas: int, *, low: int = 0, high: int | None = None
    ) -> WorkloadRef:
        from tests.k8s.cluster_objects import collection, create, deployment

        annotations = {"tideshift.io/min-replicas": str(low)}
        if high is not None:
            annotations["tideshift.io/max-replicas"] = str(high)
        body = deployment(name, replicas, annotations=annotations)
        await asyncio.to_thread(create, self.http, collection("Deployment", self.namespace), body)
        return WorkloadRef(self.namespace, "Deployment", name)

    async def settle(self) -> None:
        await asyncio.sleep(0.05)

    async def close(self) -> None:
        close = getattr(self.port, "close", None)
        if close is not None:
            await close()
        if self.nodes:
            await asyncio.to_thread(self.k8s.delete_nodes, sorted(self.nodes))
        self.admin.close()


@pytest.fixture(
    params=["sim", pytest.param("kubernetes", marks=pytest.mark.k8s)],
)
async def harness(request: pytest.FixtureRequest) -> AsyncIterator[Harness]:
    if request.param == "sim":
        yield SimHarness()
        return
    k8s_cluster = request.getfixturevalue("k8s_cluster")
    namespace = request.getfixturevalue("k8s_namespace")
    kube = KubernetesHarness(k8s_cluster, namespace)
    try:
        yield kube
    finally:
        await kube.close()


class Recorder:
    """Runs a port's watch in the background and lets a test wait for particular changes."""

    def __init__(self, port: ClusterPort) -> None:
        self.port = port
        self.changes: list[ClusterChange] = []
        self._new = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    async def __aenter__(self) -> Recorder:
        await self.port.list_nodes()
        await self.port.list_pods()
        self._task = asyncio.create_task(self._pump())
        for _ in range(5):
            await asyncio.sleep(0)  # the sim subscribes when iteration begins
        return self

    async def _pump(self) -> None:
        async for change in self.port.watch():
            self.changes.append(change)
            self._new.set()

    async def __aexit__(self, *exc: object) -> None:
        assert self._task is not None
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task

    async def wait_for(
        self, predicate: Callable[[ClusterChange], bool], *, settle: Harness, what: str
    ) -> ClusterChange:
        async def scan() -> ClusterChange:
            seen = 0
            while True:
                for change in self.changes[seen:]:
                    if predicate(change):
                        return change
                seen = len(self.changes)
                self._new.clear()
                await settle.settle()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._new.wait(), 0.2)

        try:
            return await asyncio.wait_for(scan(), WAIT)
        except TimeoutError:
            raise AssertionError(f"no change matching {what} within {WAIT}s") from None


def name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:6]}"


async def test_nodes_are_listed_and_their_changes_watched(harness: Harness) -> None:
    node_name = name("suite-node")
    async with Recorder(harness.port) as recorder:
        await harness.add_node(node_name, cpu=8)
        added = await recorder.wait_for(
            lambda c: c.type == "added" and isinstance(c.obj, Node) and c.obj.name == node_name,
            settle=harness,
            what="node added",
        )
        assert isinstance(added.obj, Node)
        assert added.obj.allocatable.cpu == 8
        assert node_name in {node.name for node in await harness.port.list_nodes()}
        await harness.remove_node(node_name)
        await recorder.wait_for(
            lambda c: c.type == "deleted" and isinstance(c.obj, Node) and c.obj.name == node_name,
            settle=harness,
            what="node deleted",
        )


async def test_pods_carry_their_deployment_and_role(harness: Harness) -> None:
    await harness.add_node(name("suite-node"), cpu=8)
    async with Recorder(harness.port) as recorder:
        target = await harness.create_deployment(name("web"), 2)

        def running_pod_of_target(change: ClusterChange) -> bool:
            pod = change.obj
            return isinstance(pod, Pod) and pod.owner == target and pod.node is not None

        change = await recorder.wait_for(
            running_pod_of_target, settle=harness, what="a bound pod of the Deployment"
        )
        assert isinstance(change.obj, Pod)
        assert change.obj.role == "serving"
        assert change.obj.namespace == harness.namespace
        assert change.obj.requests.cpu == pytest.approx(0.1)


async def test_scale_is_read_and_set_within_the_targets_bounds(harness: Harness) -> None:
    target = await harness.create_deployment(name("api"), 2, low=1, high=6)
    state = await harness.port.get_scale(target)
    assert (state.replicas, state.min_replicas, state.max_replicas) == (2, 1, 6)
    assert (await harness.port.set_scale(target, 4)).replicas == 4
    assert (await harness.port.get_scale(target)).replicas == 4
    assert (await harness.port.set_scale(target, 50)).replicas == 6
    assert (await harness.port.set_scale(target, 0)).replicas == 1
    assert (await harness.port.get_scale(target)).replicas == 1


async def test_scaling_changes_the_pods_that_exist(harness: Harness) -> None:
    await harness.add_node(name("suite-node"), cpu=16)
    target = await harness.create_deployment(name("grow"), 1)
    async with Recorder(harness.port) as recorder:
        await harness.port.set_scale(target, 3)
        names: set[str] = set()

        def third_pod(change: ClusterChange) -> bool:
            if (
                change.type == "added"
                and isinstance(change.obj, Pod)
                and change.obj.owner == target
            ):
                names.add(change.obj.name)
            return len(names) >= 2  # one existed before the watch; two are new

        await recorder.wait_for(third_pod, settle=harness, what="two new pods")
    pods = [pod for pod in await harness.port.list_pods() if pod.owner == target]
    assert len(pods) >= 3


async def test_missing_target_is_a_key_error(harness: Harness) -> None:
    with pytest.raises(KeyError):
        await harness.port.get_scale(WorkloadRef(harness.namespace, "Deployment", name("absent")))
