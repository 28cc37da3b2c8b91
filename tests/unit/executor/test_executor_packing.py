"""Executor packing helpers: scale-down victims that free whole nodes, the batch resources
each node advertises, and the usage reply's validation."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Mapping

import pytest

from tideshift.services.cluster.core.overcommit import BATCH_CPU, BATCH_MEMORY, OvercommitConfig
from tideshift.services.cluster.port import Node, Pod, Resources, WorkloadRef
from tideshift.services.cluster.sim import SimCluster, SimClusterPort, SimWorkload
from tideshift.services.executor.batch_capacity import (
    BatchAdvertiser,
    UsageError,
    parse_by_node,
)
from tideshift.services.executor.compaction import scale_down_victims

GIB = 2**30
WEB = WorkloadRef("prod", "Deployment", "web")
JOB = WorkloadRef("ml", "ElasticJob", "job")
NODES = [Node(f"n{i}", Resources(4.0, 16 * GIB)) for i in range(3)]


def pod(name: str, node: str | None, owner: WorkloadRef = WEB, *, created: float = 0.0) -> Pod:
    return Pod(
        "prod",
        name,
        Resources(1.0, GIB),
        owner=owner,
        node=node,
        ready=node is not None,
        phase="Running" if node else "Pending",
        created_at=created,
    )


def test_victims_empty_the_node_that_holds_nothing_else() -> None:
    pods = [
        pod("a1", "n0"),
        pod("a2", "n0"),
        pod("t1", "n0", JOB),  # a trainer keeps n0 busy
        pod("b1", "n1"),
        pod("b2", "n1"),
        pod("c1", "n2"),
        pod("c2", "n2"),
        pod("c3", "n2"),
    ]
    victims = scale_down_victims(pods, NODES, WEB, keep=5)
    assert sorted(victim.name for victim in victims) == ["b1", "b2"]


def test_pending_pods_count_towards_the_removals() -> None:
    pods = [pod("a1", "n0"), pod("b1", "n1"), pod("p1", None), pod("p2", None)]
    assert scale_down_victims(pods, NODES, WEB, keep=2) == []
    victims = scale_down_victims(pods, NODES, WEB, keep=1)
    assert len(victims) == 1


def test_newest_pod_goes_first_within_a_node() -> None:
    pods = [pod("old", "n0", created=1.0), pod("new", "n0", created=9.0), pod("x", "n1")]
    pods.append(pod("y", "n1"))
    pods.append(pod("z", "n1"))
    victims = scale_down_victims(pods, NODES, WEB, keep=4)
    assert [victim.name for victim in victims] == ["new"]


class Recorder:
    def __init__(self) -> None:
        self.writes: list[tuple[str, dict[str, int]]] = []

    async def set_node_resources(self, node: str, amounts: Mapping[str, int]) -> None:
        self.writes.append((node, dict(amounts)))


class Usage:
    def __init__(self, used: dict[str, tuple[float, float]]) -> None:
        self.used = used

    async def non_batch_usage(self) -> Mapping[str, tuple[float, float]]:
        return self.used


def serving_on_nodes(replicas: int) -> SimClusterPort:
    """The three nodes with `replicas` 1-core / 2 GiB serving pods, packed (4 per node)."""
    cluster = SimCluster(NODES)
    cluster.add_workload(
        SimWorkload(
            ref=WEB,
            kind="Deployment",
            role="serving",
            pod_requests=Resources(1.0, 2 * GIB),
            replicas=replicas,
        )
    )
    cluster.step(0.0)
    return SimClusterPort(cluster)


def test_advertised_batch_cpu_is_serving_idle_reservation_and_follows_its_usage() -> None:
    port = serving_on_nodes(6)
    per_node = Counter(pod.node for pod in asyncio.run(port.list_pods()))
    (full, _), (half, _) = per_node.most_common()
    assert per_node == {full: 4, half: 2}
    (empty,) = {node.name for node in NODES} - set(per_node)
    writer = Recorder()
    usage = Usage({full: (1.0, 2 * GIB), half: (0.5, 1 * GIB), empty: (0.0, 0.0)})
    advertiser = BatchAdvertiser(port, writer, usage, OvercommitConfig(margin=0.25))
    first = asyncio.run(advertiser.advertise_once())
    # 4 cores requested, 1 used: 3 idle, within 4 x 0.75 - 1 = 2 reclaimable; memory 6 GiB idle
    assert first[full] == {BATCH_CPU: 2000, BATCH_MEMORY: 6 * GIB}
    assert first[half] == {BATCH_CPU: 1500, BATCH_MEMORY: 3 * GIB}  # 2 - 0.5 idle
    # room no request holds is not lent, however little is used there
    assert first[empty] == {BATCH_CPU: 0, BATCH_MEMORY: 0}
    usage.used[full] = (2.5, 2 * GIB)  # serving got busier on the full node
    asyncio.run(advertiser.advertise_once())
    assert writer.writes[-1] == (full, {BATCH_CPU: 500, BATCH_MEMORY: 6 * GIB})
    assert len(writer.writes) == 4  # the other nodes unchanged: not written again


def test_a_node_without_usage_lends_nothing() -> None:
    port = SimClusterPort(SimCluster(NODES[:1]))
    advertiser = BatchAdvertiser(port, Recorder(), Usage({}), OvercommitConfig())
    assert asyncio.run(advertiser.advertise_once())["n0"] == {BATCH_CPU: 0, BATCH_MEMORY: 0}


@pytest.mark.parametrize(
    ("reply", "expected"),
    [
        ({"status": "error"}, "expected an instant vector"),
        ([{"metric": {}, "value": [0, "1"]}], "series 0: expected metric.node"),
        ([{"metric": {"node": "n0"}, "value": [0, "NaN"]}], "finite usage"),
        ([{"metric": {"node": "n0"}, "value": [0, "-1"]}], "finite usage"),
    ],
)
def test_malformed_usage_is_refused_naming_the_series(reply: object, expected: str) -> None:
    with pytest.raises(UsageError, match=expected):
        parse_by_node(reply, "q")


def test_usage_sums_series_per_node() -> None:
    reply = [
        {"metric": {"node": "n0"}, "value": [0, "1.5"]},
        {"metric": {"node": "n0"}, "value": [0, "0.5"]},
    ]
    assert parse_by_node(reply, "q") == {"n0": 2.0}


class ChangingNodes:
    """Our ClusterListing port: a different set of nodes on every listing (nodes come, go)."""

    def __init__(self) -> None:
        self.round = 0

    async def list_nodes(self) -> list[Node]:
        self.round += 1
        return [Node(f"r{self.round}-n{i}", Resources(4.0, 16 * GIB)) for i in range(100)]

    async def list_pods(self) -> list[Pod]:
        return []


def test_what_was_advertised_on_deleted_nodes_is_forgotten() -> None:
    from tideshift.services.executor.batch_capacity import ADVERTISED

    advertiser = BatchAdvertiser(ChangingNodes(), Recorder(), Usage({}), OvercommitConfig())
    for _ in range(50):  # 5,000 distinct node names over time
        current = asyncio.run(advertiser.advertise_once())
    assert len(current) == 100 and len(advertiser.advertised) == 100
    assert set(advertiser.advertised) == {f"r50-n{i}" for i in range(100)}
    series = {sample.labels["node"] for sample in ADVERTISED.collect()[0].samples}
    assert not any(name.startswith("r1-") for name in series)
