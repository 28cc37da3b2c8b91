"""A scenario's serving workload is sized by the serving workload spec (events/models.py
ServingPolicy): `policy()` builds it, `fields_of` sets a scenario's fields from one, and the
planner's workload is built from it."""

from __future__ import annotations

import pytest

from tideshift.events import ServingPolicy
from tideshift.services.simulator.scenario import SIMULATED_TARGET_UTILIZATION, ServingSpec
from tideshift.services.simulator.world import serving_workload

TRAFFIC = {"kind": "constant", "rps": 100.0}
REPLICA = {"cpu": 1.0, "memory_gib": 2.0}


def test_a_scenario_without_policy_fields_takes_the_spec_defaults() -> None:
    spec = ServingSpec.model_validate(
        {"name": "web", "replica": REPLICA, "capacity_rps": 50.0, "traffic": TRAFFIC}
    )
    policy = spec.policy()
    defaults = ServingPolicy(capacity_rps=1.0)
    assert policy.capacity_rps == pytest.approx(50.0 * SIMULATED_TARGET_UTILIZATION)
    assert policy.lead_time_seconds == spec.startup_delay_s
    for field in ("min_replicas", "max_replicas", "margin_seconds", "stabilization_seconds"):
        assert getattr(policy, field) == getattr(defaults, field), field
    assert policy.quantile == defaults.quantile


def test_a_labelled_workloads_spec_round_trips_through_a_scenario() -> None:
    labelled = ServingPolicy(
        capacity_rps=40.0,
        min_replicas=2,
        max_replicas=30,
        lead_time_seconds=45.0,
        margin_seconds=90.0,
        stabilization_seconds=120.0,
        quantile=0.9,
        target_utilization=0.8,
    )
    fields = ServingSpec.fields_of(labelled)
    spec = ServingSpec.model_validate(
        {"name": "web", "replica": REPLICA, "traffic": TRAFFIC} | fields
    )
    back = spec.policy()
    assert back.capacity_rps == pytest.approx(labelled.capacity_rps)
    assert back.model_dump(exclude={"capacity_rps"}) == labelled.model_dump(
        exclude={"capacity_rps"}
    )
    workload = serving_workload(spec)
    assert (workload.margin_s, workload.target_utilization) == (90.0, 0.8)
