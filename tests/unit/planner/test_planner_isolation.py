"""Each target inside its own guard: one the policy cannot plan is skipped with a reason and
keeps its place; every other target is planned as usual."""

from __future__ import annotations

import dataclasses

import pytest

from tideshift import events
from tideshift.services.planner import core as pol
from tideshift.services.planner.core.baselines import make_policy
from tideshift.services.planner.core.inputs import ClusterTable, plan_inputs
from tideshift.services.planner.core.isolation import Quarantine
from tideshift.services.planner.outputs import KEY_LIMIT, idempotency_key

NOW = 1_000_000.0


def serving(name: str, capacity_rps: float) -> pol.ServingWorkload:
    return pol.ServingWorkload(
        target=pol.Target("shop", "Deployment.apps", name),
        replica_requests=(0.1, 1e6, 0.0),
        capacity_rps=capacity_rps,
        min_replicas=1,
        max_replicas=50,
        lead_time_s=0.0,
        stabilization_s=0.0,
        quantile=0.95,
    )


def flat(rps: float) -> pol.Forecast:
    times = tuple(NOW + 60.0 * i for i in range(30))
    return pol.Forecast(NOW, times, {q: (rps,) * 30 for q in (0.5, 0.9, 0.95, 0.99)})


def inputs(*workloads: pol.ServingWorkload) -> pol.PlanInputs:
    table = ClusterTable()
    table.upsert_node("n1", (64.0, 1e12, 0.0), schedulable=True)
    return plan_inputs(
        table.view(),
        workloads,
        (),
        {w.target: flat(100.0) for w in workloads},
        wanted={w.target: 3 for w in workloads},
    )


GOOD, BAD = serving("good", 10.0), serving("bad", 5e-324)


def test_the_odd_target_makes_the_whole_policy_raise_without_the_guard() -> None:
    policy = make_policy("tideshift")
    with pytest.raises(OverflowError):
        policy.plan(inputs(GOOD, BAD), policy.initial_state(), NOW)


def test_one_unplannable_target_is_skipped_with_its_reason_the_others_are_planned() -> None:
    policy = make_policy("tideshift")
    quarantine = Quarantine()
    decision, _, skipped = quarantine.plan(policy, inputs(GOOD, BAD), policy.initial_state(), NOW)
    assert decision.desired() == {GOOD.target: 10}  # 100 req/s at 10 per replica
    assert list(skipped) == [BAD.target]
    assert skipped[BAD.target].startswith("skipped: cannot be planned (OverflowError")


def test_a_skipped_target_stays_skipped_until_its_item_changes() -> None:
    policy = make_policy("tideshift")
    quarantine = Quarantine()
    quarantine.plan(policy, inputs(GOOD, BAD), policy.initial_state(), NOW)
    _, _, again = quarantine.plan(policy, inputs(GOOD, BAD), policy.initial_state(), NOW)
    assert list(again) == [BAD.target]
    fixed = dataclasses.replace(BAD, capacity_rps=20.0)
    decision, _, skipped = quarantine.plan(policy, inputs(GOOD, fixed), policy.initial_state(), NOW)
    assert skipped == {}
    assert decision.desired() == {GOOD.target: 10, fixed.target: 5}


def test_a_failure_no_single_target_explains_is_raised() -> None:
    class Broken:
        name = "broken"

        def initial_state(self) -> None:
            return None

        def plan(self, inputs: pol.PlanInputs, state: None, now: float) -> None:
            if len(inputs.serving) > 1:
                raise RuntimeError("only together")

    with pytest.raises(RuntimeError, match="only together"):
        Quarantine().plan(Broken(), inputs(GOOD, BAD), None, NOW)  # type: ignore[arg-type]


def test_idempotency_keys_fit_and_stay_unique_for_the_longest_legal_names() -> None:
    plan_id = "p" * 115 + "-" + "0" * 12
    names = ["a" * 253, "a" * 252 + "b", "a." * 126 + "z"]
    keys = {
        idempotency_key(plan_id, events.WorkloadRef("n" * 63, "Job.batch.volcano.sh", name))
        for name in names
    }
    assert len(keys) == len(names)
    assert all(len(key) <= KEY_LIMIT for key in keys)
    short = events.WorkloadRef("shop", "Deployment", "web")
    assert idempotency_key("plan-1", short) == "plan-1:Deployment.apps/shop/web"
