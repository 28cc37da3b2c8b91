"""The demo's meter: figures integrated over explicit simulated time."""

from __future__ import annotations

import pytest

from tideshift.services.demo.clock import SimClock
from tideshift.services.demo.meter import Meter
from tideshift.services.demo.world import JobShape, ServingShape, WorldShape, build_cluster

START = 1_000_000.0
SHAPE = WorldShape(
    nodes=4,
    node_cpu=8.0,
    node_memory_gib=32.0,
    serving=ServingShape(
        capacity_rps=10.0, target_utilization=1.0, min_replicas=1, startup_delay_s=0.0
    ),
    jobs=(JobShape("job-a", trainer_cpu=8.0, max_trainers=2, pservers=0, startup_delay_s=0.0),),
)


def test_serving_starts_sized_for_the_initial_demand_and_jobs_at_their_minimum() -> None:
    cluster = build_cluster(SHAPE, now=START, initial_demand_rps=25.0)
    cluster.step(START)
    assert cluster.ready_count(SHAPE.serving.ref) == 3  # ceil(25 / 10)
    assert cluster.ready_count(SHAPE.jobs[0].ref) == 1


def test_shortfall_is_measured_against_ready_capacity() -> None:
    cluster = build_cluster(SHAPE, now=START, initial_demand_rps=20.0)
    cluster.step(START)
    meter = Meter(SHAPE, start=START, sample_every_s=60.0)
    meter.record(START, cluster, 20.0)
    meter.record(START + 60, cluster, 20.0)  # 2 replicas x 10 req/s: exactly enough
    assert meter.accounts.shortfall_minutes == set()
    meter.record(START + 180, cluster, 30.0)  # 10 req/s short for 120 s: minutes 1 and 2
    assert meter.accounts.shortfall_minutes == {1, 2}
    assert meter.accounts.shortfall_requests == pytest.approx(1200.0)
    assert meter.accounts.demand_requests == pytest.approx(20 * 60 + 30 * 120)


def test_utilisation_and_training_work_integrate_over_time() -> None:
    cluster = build_cluster(SHAPE, now=START, initial_demand_rps=10.0)
    cluster.step(START)
    meter = Meter(SHAPE, start=START, sample_every_s=60.0)
    meter.record(START, cluster, 10.0)
    meter.record(START + 100, cluster, 10.0)
    # 1 serving cpu + 8 trainer cpu of 32
    assert meter.accounts.utilization()["cpu"] == pytest.approx(9 / 32)
    # one trainer, running since before the start: 1 ** 0.8 per second for 100 s
    assert meter.jobs["job-a"].work == pytest.approx(100.0)
    cluster.scale(SHAPE.jobs[0].ref, 2)
    cluster.step(START + 100)
    meter.record(START + 200, cluster, 10.0)
    # the trainer set changed: no progress for restart_cost_s (10 s) of the next 100 s
    assert meter.jobs["job-a"].work == pytest.approx(100.0 + 2**0.8 * 90)
    assert meter.pending(START + 200) == [0.0]


def test_cores_by_use_and_night_utilisation() -> None:
    cluster = build_cluster(SHAPE, now=START, initial_demand_rps=20.0)
    cluster.step(START)
    meter = Meter(SHAPE, start=START, sample_every_s=3600.0)
    # two serving replicas (1 cpu each) at 15 req/s of 20: 1.5 cores in use, 0.5 idle
    for hour in range(8):
        meter.record(START + hour * 3600, cluster, 15.0)
    assert meter.series["cores_serving_used"][0] == pytest.approx(1.5)
    assert meter.series["cores_serving_idle"][0] == pytest.approx(0.5)
    assert meter.series["cores_training"][0] == pytest.approx(8.0)
    assert meter.series["cores_free"][0] == pytest.approx(32 - 10)
    # the job wants more; serving's node has 6 free cores, too few for an 8-core trainer
    assert meter.series["stranded_cpu"][0] == pytest.approx(6.0)
    assert meter.accounts.night_cpu_utilization() == pytest.approx(10 / 32)
    assert meter.accounts.cpu_used == pytest.approx(9.5 / 32)


def test_free_cores_where_no_wanted_trainer_fits_are_stranded() -> None:
    cluster = build_cluster(SHAPE, now=START, initial_demand_rps=30.0)
    cluster.scale(SHAPE.jobs[0].ref, 2)
    cluster.step(START)
    meter = Meter(SHAPE, start=START, sample_every_s=60.0)
    meter.record(START, cluster, 30.0)
    # serving's 3 cores sit on one node (packed), the two 8-core trainers fill two others:
    # the job is at its maximum, so nothing is wanted and nothing stranded
    assert meter.series["stranded_cpu"][0] == pytest.approx(0.0)
    cluster.scale(SHAPE.jobs[0].ref, 1)
    cluster.step(START + 60)
    meter.record(START + 60, cluster, 30.0)
    # now the job wants more: 5 free cores beside serving fit no 8-core trainer
    assert meter.series["stranded_cpu"][-1] == pytest.approx(5.0)


def test_trainers_by_hour_of_day() -> None:
    cluster = build_cluster(SHAPE, now=START, initial_demand_rps=10.0)
    cluster.step(START)
    meter = Meter(SHAPE, start=START, sample_every_s=3600.0)
    for hour in range(24):
        if hour == 12:
            cluster.scale(SHAPE.jobs[0].ref, 2)
            cluster.step(START + hour * 3600)
        meter.record(START + hour * 3600, cluster, 10.0)
    assert meter.trainers_between("job-a", 0, 6) == pytest.approx(1.0)
    assert meter.trainers_between("job-a", 12, 18) == pytest.approx(2.0)
    assert meter.trainers_between("job-b", 0, 6) is None


def test_sim_clock_may_begin_before_the_measured_day() -> None:
    wall = [100.0]
    clock = SimClock(288.0, start=START, begin=START - 3600, monotonic=lambda: wall[0])
    assert clock.now() == START - 3600
    wall[0] = 100.0 + 3600 / 288
    assert clock.now() == pytest.approx(START)
    with pytest.raises(ValueError, match="begin"):
        SimClock(1.0, start=START, begin=START + 1)


def test_sim_clock_runs_at_speed() -> None:
    wall = [100.0]
    clock = SimClock(288.0, start=START, monotonic=lambda: wall[0])
    assert clock.now() == START
    wall[0] = 110.0
    assert clock.now() - START == pytest.approx(2880.0)
    assert clock.datetime().timestamp() == pytest.approx(START + 2880.0)
    with pytest.raises(ValueError):
        SimClock(0)
    frozen = SimClock(100.0, start=START, monotonic=lambda: wall[0], frozen=True)
    wall[0] = 200.0
    assert frozen.now() == START  # services start up at the start time
    frozen.run()
    wall[0] = 201.0
    assert frozen.now() - START == pytest.approx(100.0)
