"""The simulated cluster: scheduling, preemption, gangs, start-up delay, controllers, the port."""

from __future__ import annotations

import asyncio

import pytest

from tideshift.services.cluster.port import ClusterChange, ClusterPort, Node, Resources, WorkloadRef
from tideshift.services.cluster.sim import SimCluster, SimClusterPort, SimWorkload

GIB = 2**30
WEB = WorkloadRef("prod", "Deployment", "web")
JOB = WorkloadRef("ml", "ElasticJob", "job")


def node(name: str, cpu: float = 4.0, gpu: int = 0) -> Node:
    return Node(name, Resources(cpu, 16 * GIB, gpu))


def deployment(replicas: int, *, priority: int = 100, delay: float = 10.0) -> SimWorkload:
    return SimWorkload(
        ref=WEB,
        kind="Deployment",
        role="serving",
        pod_requests=Resources(1.0, GIB),
        replicas=replicas,
        priority=priority,
        startup_delay_s=delay,
        max_replicas=100,
    )


def elastic_job(replicas: int, *, gang: int, companions: int = 1) -> SimWorkload:
    return SimWorkload(
        ref=JOB,
        kind="ElasticJob",
        role="training",
        pod_requests=Resources(1.0, GIB),
        replicas=replicas,
        priority=0,
        startup_delay_s=5.0,
        gang_min=gang,
        companion_count=companions,
        companion_requests=Resources(1.0, GIB),
    )


def test_pods_become_ready_after_the_start_up_delay() -> None:
    cluster = SimCluster([node("a")])
    cluster.add_workload(deployment(2, delay=10.0))
    cluster.step(0.0)
    assert cluster.bound_count(WEB) == 2
    assert cluster.ready_count(WEB) == 0
    cluster.step(9.0)
    assert cluster.ready_count(WEB) == 0
    cluster.step(10.0)
    assert cluster.ready_count(WEB) == 2


def test_pods_that_fit_nowhere_stay_pending() -> None:
    cluster = SimCluster([node("a", cpu=2.0), node("b", cpu=1.5)])
    cluster.add_workload(deployment(5))
    cluster.step(0.0)
    assert cluster.bound_count(WEB) == 3  # 2 on a, 1 on b: per-node packing, not totals
    assert cluster.bound_requests_total().cpu == 3.0


def test_higher_priority_preempts_lower() -> None:
    cluster = SimCluster([node("a", cpu=4.0)])
    cluster.add_workload(elastic_job(4, gang=1, companions=0))
    cluster.step(0.0)
    assert cluster.bound_count(JOB) == 4
    cluster.add_workload(deployment(2, priority=1000))
    cluster.step(1.0)
    assert cluster.bound_count(WEB) == 2
    assert cluster.bound_count(JOB) == 2
    assert cluster.counters.preemptions == 2
    assert cluster.workload(JOB).replicas == 4  # the controller keeps wanting them (pending)


def test_gang_binds_all_or_nothing() -> None:
    cluster = SimCluster([node("a", cpu=4.0)])
    cluster.add_workload(elastic_job(5, gang=4, companions=1))  # needs 5 cpu for its gang
    cluster.step(0.0)
    assert cluster.bound_count(JOB) == 0
    cluster.scale(JOB, 3)
    cluster.workload(JOB).gang_min = 3
    cluster.step(1.0)
    assert cluster.bound_count(JOB) == 3
    cluster.step(6.0)
    assert cluster.job_running(JOB)


def test_deployment_scale_down_removes_pending_then_frees_a_whole_node() -> None:
    cluster = SimCluster([node("a", cpu=3.0), node("b", cpu=1.0)])
    cluster.add_workload(deployment(5))
    cluster.step(0.0)
    assert cluster.bound_count(WEB) == 4  # one pending
    cluster.scale(WEB, 3)
    cluster.step(1.0)
    per_node = sorted(pod.node or "" for pod in cluster.pods())
    assert per_node == ["a", "a", "a"]  # the pending one, then b's only pod: b is free
    assert cluster.counters.pods_stopped.get("serving") == 1


def test_scale_is_clamped_to_the_targets_bounds() -> None:
    cluster = SimCluster([node("a")])
    cluster.add_workload(deployment(1))
    assert cluster.scale(WEB, 500).replicas == 100


def test_time_only_runs_forward() -> None:
    cluster = SimCluster([node("a")], now=10.0)
    with pytest.raises(ValueError, match="forward"):
        cluster.step(5.0)


async def test_port_lists_watches_and_scales() -> None:
    cluster = SimCluster([node("a")])
    port: ClusterPort = SimClusterPort(cluster)
    cluster.add_workload(deployment(1))
    cluster.step(0.0)
    assert [n.name for n in await port.list_nodes()] == ["a"]
    assert len(await port.list_pods()) == 1

    seen: list[ClusterChange] = []
    watch = port.watch()

    async def consume() -> None:
        async for change in watch:
            seen.append(change)
            if len(seen) == 2:
                return

    task = asyncio.create_task(consume())
    await asyncio.sleep(0)  # let the watcher subscribe before the change happens
    state = await port.set_scale(WEB, 2)
    assert state.replicas == 2
    cluster.step(1.0)  # creates then binds the new pod
    await asyncio.wait_for(task, timeout=5)
    await watch.aclose()  # type: ignore[attr-defined]
    assert [c.type for c in seen] == ["added", "modified"]
    assert (await port.get_scale(WEB)).replicas == 2
    with pytest.raises(KeyError):
        await port.get_scale(WorkloadRef("x", "Deployment", "missing"))
