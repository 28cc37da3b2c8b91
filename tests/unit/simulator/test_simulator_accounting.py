"""The accountant `simulate` and the demo share: figures integrated over explicit intervals."""

from __future__ import annotations

import numpy as np
import pytest

from tideshift.services.simulator.core.measures import Accountant, Sample

ALLOC = np.array([100.0, 400.0, 0.0])


def sample(**changes: object) -> Sample:
    values: dict[str, object] = {
        "allocatable": ALLOC,
        "requested": np.array([80.0, 100.0, 0.0]),
        "used_cpu": 60.0,
        "lent_cpu": 10.0,
        "stranded": np.array([5.0, 0.0, 0.0]),
        "demand_rps": (100.0,),
        "capacity_rps": (120.0,),
        "spare_cpu": 40.0,
        "training_cpu": 30.0,
        "starved": False,
    }
    values.update(changes)
    return Sample(**values)  # type: ignore[arg-type]


def test_time_weighted_means_and_resources_the_cluster_has() -> None:
    accounts = Accountant()
    accounts.add(0.0, 60.0, sample())
    accounts.add(60.0, 180.0, sample(requested=np.array([50.0, 100.0, 0.0]), used_cpu=30.0))
    assert accounts.utilization() == {
        "cpu": pytest.approx((0.8 * 60 + 0.5 * 120) / 180),
        "memory": pytest.approx(0.25),
    }  # no GPUs: no gpu figure
    assert accounts.cpu_used == pytest.approx((0.6 * 60 + 0.3 * 120) / 180)
    assert accounts.cpu_lent == pytest.approx(0.1)
    assert accounts.stranded() == {"cpu": pytest.approx(0.05)}
    assert accounts.training_share_of_spare == pytest.approx(30 / 40)


def test_shortfall_is_per_workload_and_counts_the_minutes_touched() -> None:
    accounts = Accountant(start=1000.0)
    # the second workload is 10 req/s short; the first one's spare does not cover it
    short = sample(demand_rps=(50.0, 60.0), capacity_rps=(100.0, 50.0))
    accounts.add(1030.0, 1150.0, short)  # run-seconds 30-150: minutes 0, 1, 2
    assert accounts.shortfall_minutes == {0, 1, 2}
    assert accounts.shortfall_requests == pytest.approx(10.0 * 120)
    assert accounts.shortfall_fraction == pytest.approx(10.0 / 110)
    accounts.add(1150.0, 1200.0, sample(starved=True))
    assert accounts.starved_minutes == {2, 3}


def test_night_is_midnight_to_six_of_the_simulated_day() -> None:
    accounts = Accountant(start=0.0)
    accounts.add(23 * 3600.0, 24 * 3600.0, sample(requested=np.array([50.0, 0.0, 0.0])))
    assert accounts.night_cpu_utilization() is None
    accounts.add(24 * 3600.0, 25 * 3600.0, sample(requested=np.array([90.0, 0.0, 0.0])))
    assert accounts.night_cpu_utilization() == pytest.approx(0.9)
