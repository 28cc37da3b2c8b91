"""The simulated scheduler packs as `cluster.placement` says: CPU-only pods keep off GPU nodes
while CPU nodes have room, pods pile onto the busiest node that fits, and a scale-down takes
CPU-only pods off GPU nodes first."""

from __future__ import annotations

from tideshift.services.cluster.port import Node, Resources, Role, WorkloadRef
from tideshift.services.cluster.sim import SimCluster, SimWorkload

GIB = 2**30
WEB = WorkloadRef("prod", "Deployment", "web")


def deployment(
    ref: WorkloadRef, role: Role, requests: Resources, replicas: int, priority: int
) -> SimWorkload:
    return SimWorkload(
        ref=ref,
        kind="Deployment",
        role=role,
        pod_requests=requests,
        replicas=replicas,
        priority=priority,
        startup_delay_s=1.0,
        max_replicas=100,
    )


def web(replicas: int) -> SimWorkload:
    return deployment(WEB, "serving", Resources(1.0, GIB), replicas, priority=100)


def nodes_of(cluster: SimCluster) -> list[str]:
    return sorted(pod.node or "" for pod in cluster.pods())


def test_cpu_only_pods_fill_cpu_nodes_before_gpu_nodes() -> None:
    cluster = SimCluster(
        [Node("gpu", Resources(8.0, 32 * GIB, 4)), Node("cpu", Resources(4.0, 16 * GIB))]
    )
    cluster.add_workload(web(4))
    cluster.step(0.0)
    assert nodes_of(cluster) == ["cpu"] * 4
    cluster.scale(WEB, 5)
    cluster.step(1.0)
    assert nodes_of(cluster) == ["cpu"] * 4 + ["gpu"]  # only once the cpu node is full


def test_pods_pile_onto_the_busiest_node_leaving_others_whole() -> None:
    cluster = SimCluster([Node(name, Resources(4.0, 16 * GIB)) for name in ("a", "b", "c")])
    cluster.add_workload(web(6))
    cluster.step(0.0)
    placed = nodes_of(cluster)
    assert sorted(placed.count(name) for name in ("a", "b", "c")) == [0, 2, 4]


def test_scale_down_takes_cpu_pods_off_gpu_nodes_first() -> None:
    """A GPU trainer keeps the GPU node busier than the CPU node would stay, so by fullness
    alone the CPU node's pods would go; the CPU-only pods leave the GPU node first instead."""
    cluster = SimCluster(
        [Node("gpu", Resources(8.0, 32 * GIB, 4)), Node("cpu", Resources(4.0, 16 * GIB))]
    )
    trainer = WorkloadRef("ml", "Deployment", "gpu-trainer")
    cluster.add_workload(deployment(trainer, "training", Resources(4.0, 8 * GIB, 1), 1, priority=0))
    cluster.add_workload(web(6))
    cluster.step(0.0)
    web_nodes = sorted(pod.node or "" for pod in cluster.pods() if pod.owner == WEB)
    assert web_nodes == ["cpu"] * 4 + ["gpu"] * 2
    cluster.scale(WEB, 4)
    cluster.step(1.0)
    web_nodes = sorted(pod.node or "" for pod in cluster.pods() if pod.owner == WEB)
    assert web_nodes == ["cpu"] * 4
