"""Batch trainers in the simulated world (`simulate`'s and the demo's) borrow serving's idle
reservation, make way first when serving's usage rises, and come back when it falls."""

from __future__ import annotations

from tideshift.services.cluster.core.overcommit import OvercommitConfig
from tideshift.services.cluster.port import Node, Resources, WorkloadRef
from tideshift.services.cluster.sim import SimWorkload
from tideshift.services.demo.meter import Meter
from tideshift.services.demo.report import summarize
from tideshift.services.demo.world import GIB, JobShape, ServingShape, WorldShape
from tideshift.services.simulator.lending import LendingCluster

WEB = WorkloadRef("demo", "Deployment", "web")
LEND = WorkloadRef("demo", "ElasticJob", "lend")
TRAINER = Resources(2.0, 4 * GIB, 0)


def lending_cluster(
    *, batch_trainers: int, nodes: int = 1, serving_replicas: int = 10
) -> LendingCluster:
    cluster = LendingCluster(
        [Node(f"n{i + 1}", Resources(16.0, 64 * GIB, 0)) for i in range(nodes)],
        now=0.0,
        batch_use={LEND: TRAINER},
        overcommit=OvercommitConfig(margin=0.05),
    )
    cluster.add_workload(
        SimWorkload(
            ref=WEB,
            kind="Deployment",
            role="serving",
            pod_requests=Resources(1.0, 2 * GIB, 0),
            replicas=serving_replicas,
            priority=1000,
        )
    )
    cluster.add_workload(
        SimWorkload(
            ref=LEND,
            kind="ElasticJob",
            role="training",
            pod_requests=Resources(),  # batch: only the extended resources
            replicas=batch_trainers,
        )
    )
    return cluster


def test_batch_trainers_bind_on_what_serving_reserves_and_does_not_use() -> None:
    cluster = lending_cluster(batch_trainers=6)
    cluster.serving_busy[WEB] = 0.5  # 10 cores requested, 5 used once ready
    cluster.step(1.0)
    # serving replicas still starting use their requests: nothing idle to lend yet
    assert cluster.bound_count(LEND) == 0
    cluster.step(2.0)
    # ready: 5 idle cores (within 16 x 0.95 - 5 = 10.2 reclaimable): two 2-core trainers; the
    # 6 cores no request holds are not lent
    assert cluster.bound_count(LEND) == 2
    assert cluster.lent_cpu() == 4.0
    assert not cluster.starved()
    assert cluster.bound_requests_total().cpu == 10.0  # batch trainers request no cpu


def test_rising_serving_usage_evicts_batch_trainers_first_then_they_return() -> None:
    cluster = lending_cluster(batch_trainers=4)
    cluster.serving_busy[WEB] = 0.2  # 8 idle cores
    cluster.step(1.0)
    cluster.step(2.0)
    assert cluster.bound_count(LEND) == 4

    cluster.serving_busy[WEB] = 1.0  # serving uses all 10 cores: 18 cores in use on 16
    cluster.step(3.0)
    assert cluster.starved()
    assert cluster.evict_over_reclaimable() == 2  # 15.2 - 10 = 5.2 left: two trainers stay
    assert not cluster.starved()
    assert cluster.bound_count(WEB) == 10  # serving kept every replica
    cluster.step(4.0)
    assert cluster.bound_count(LEND) == 2  # nothing idle: the evicted ones wait, pending

    cluster.serving_busy[WEB] = 0.2
    cluster.step(5.0)
    assert cluster.bound_count(LEND) == 4


def test_a_pod_with_requests_takes_its_cores_from_batch_trainers_on_binding() -> None:
    cluster = lending_cluster(batch_trainers=5)
    cluster.serving_busy[WEB] = 0.2
    cluster.step(1.0)
    cluster.step(2.0)
    assert cluster.bound_count(LEND) == 4  # the 8 idle cores
    cluster.scale(WEB, 16)  # six more replicas bind and start, using their requests
    cluster.step(3.0)
    assert cluster.bound_count(WEB) == 16
    # on binding: 15.2 - 2 (ready) - 6 (starting) = 7.2 cores: three trainers stay
    assert cluster.bound_count(LEND) == 3
    assert not cluster.starved()


def test_a_batch_job_scaled_down_loses_trainers_where_lent_room_is_shortest() -> None:
    # 20 serving replicas packed: 16 on one node, 4 on the other
    cluster = lending_cluster(batch_trainers=0, nodes=2, serving_replicas=20)
    cluster.serving_busy[WEB] = 0.5
    cluster.step(1.0)
    cluster.scale(LEND, 4)
    cluster.step(2.0)
    by_node = lambda: sorted(pod.node or "" for pod in cluster.pods() if pod.owner == LEND)  # noqa: E731
    full = next(pod.node for pod in cluster.pods() if pod.owner == WEB and pod.node)
    placed = by_node()
    # 8 idle cores on the full node lend three trainers (7.2 reclaimable), 2 on the other one
    assert placed.count(full) == 3 and len(placed) == 4
    cluster.scale(LEND, 3)
    cluster.step(3.0)
    # the other node had no room left beyond its trainer (2 - 2), the full one 1.2 cores
    assert by_node() == [full] * 3


def test_meter_counts_lent_cores_as_used_and_starved_minutes() -> None:
    world = WorldShape(
        nodes=1,
        serving=ServingShape(capacity_rps=10.0, min_replicas=1, startup_delay_s=0.0),
        jobs=(JobShape("lend", trainer_cpu=2.0, trainer_memory_gib=4.0, batch=True),),
    )
    cluster = lending_cluster(batch_trainers=0)
    cluster.step(0.0)  # ten ready 1-core serving replicas
    meter = Meter(world, start=0.0, sample_every_s=60.0)
    meter.record(0.0, cluster, 50.0)
    meter.record(60.0, cluster, 50.0, lent_cpu=4.0)
    meter.record(120.0, cluster, 50.0, lent_cpu=4.0, starved=True)
    # 5 of 16 cores serve (50 req/s at 10 per core); 4 more are lent for the whole run
    assert meter.accounts.cpu_used == (5.0 + 4.0) / 16.0
    assert meter.accounts.cpu_lent == 4.0 / 16.0
    assert meter.accounts.starved_minutes == {1}
    # the picture's bands still add up to the node
    last = {key: meter.series[key][-1] for key in meter.series if key.startswith("cores_")}
    assert sum(last.values()) == 16.0
    assert last["cores_lent"] == 4.0


def test_training_grew_at_night_counts_the_jobs_on_requests_not_the_batch_one() -> None:
    lend = JobShape("lend", trainer_cpu=1.0, trainer_memory_gib=2.0, batch=True)
    meter = Meter(WorldShape(jobs=(JobShape("big"), lend)), start=0.0)
    meter.series["t"] = [3600.0 * 2, 3600.0 * 12]  # 02:00 and 12:00
    meter.series["trainers"] = {"big": [4, 1], "lend": [0, 20]}
    summary = summarize(meter, end=86_400.0, trainer_churn=0, wall_s=1.0)
    assert summary.batch_jobs == ("lend",)
    # 4 + 0 at night against 1 + 20 by day, but the batch job rides serving by design
    assert summary.training_grew_at_night is True
