"""Batch capacity in the policy: opted-in jobs are planned on what serving reserves but does
not use (never on room no request holds), shrink first when serving's usage rises, and grow
only into room that stayed."""

from __future__ import annotations

from dataclasses import replace

import pytest

from tideshift.services.cluster.core.overcommit import OvercommitConfig
from tideshift.services.planner.core import (
    ClusterView,
    Forecast,
    NodeSpec,
    PlanInputs,
    PlanState,
    PodSpec,
    PolicyConfig,
    ServingWorkload,
    Target,
    TrainingJob,
    plan,
)
from tideshift.services.planner.core.lending.batch import serving_staying
from tideshift.services.planner.core.packing import cluster_entries

GIB = 2**30
WEB = Target("prod", "Deployment", "web")
BATCH = Target("ml", "ElasticJob", "batch")
PLAIN = Target("ml", "ElasticJob", "plain")


def flat_forecast(rps: float) -> Forecast:
    times = tuple(60.0 * i for i in range(60))
    return Forecast(0.0, times, {0.9: tuple(rps for _ in times)})


def web() -> ServingWorkload:
    # 10 rps per replica at a 50 % target utilisation: a replica at capacity uses half its cpu.
    # 4 GiB each, so that memory is not what limits the 1-GiB trainers.
    return ServingWorkload(
        WEB,
        (4.0, 4 * GIB, 0.0),
        capacity_rps=10.0,
        min_replicas=4,
        max_replicas=4,
        lead_time_s=30.0,
        margin_s=30.0,
        quantile=0.9,
        target_utilization=0.5,
    )


def job(target: Target, *, batch: bool) -> TrainingJob:
    return TrainingJob(target, (1.0, GIB, 0.0), min_trainers=1, max_trainers=40, batch=batch)


def inputs(
    rps: float,
    jobs: tuple[TrainingJob, ...],
    trainers: dict[str, int],
    *,
    grow_after_s: float = 0.0,
    empty_nodes: int = 0,
    serving_current: int = 4,
    serving: ServingWorkload | None = None,
    observed_rps: float | None = None,
) -> PlanInputs:
    """Two 8-cpu nodes, each holding two serving replicas (all of its cpu requested), and
    `empty_nodes` more without pods; `trainers` bound batch trainers (zero requests, as the
    API shows them) per node. Growth hysteresis is off unless `grow_after_s` is given."""
    nodes = [NodeSpec(f"n{i}", (8.0, 64.0 * GIB, 0.0)) for i in range(2 + empty_nodes)]
    pods = [PodSpec((4.0, 4 * GIB, 0.0), f"n{i % 2}", WEB) for i in range(4)]
    pods += [
        PodSpec((0.0, 0.0, 0.0), node, BATCH)
        for node, count in trainers.items()
        for _ in range(count)
    ]
    return PlanInputs(
        cluster=ClusterView.build(nodes, pods),
        serving=(serving or web(),),
        jobs=jobs,
        forecasts={WEB: flat_forecast(rps)},
        current={WEB: serving_current, BATCH: sum(trainers.values())},
        config=PolicyConfig(
            overcommit=OvercommitConfig(margin=0.1),
            min_trainer_lifetime_s=0.0,
            batch_grow_after_s=grow_after_s,
        ),
        observed_rps={WEB: rps if observed_rps is None else observed_rps},
    )


def decision_of(decision_targets: object, target: Target) -> tuple[int, str]:
    for item in decision_targets:  # type: ignore[attr-defined]
        if item.target == target:
            return item.desired, item.reason
    raise AssertionError(f"no decision for {target}")


def test_batch_job_runs_on_idle_serving_reservation_where_a_plain_job_gets_nothing() -> None:
    # 20 rps on 40 rps of capacity: serving uses 4 x 4 x 0.5 x 0.5 = 4 of its 16 cpu.
    decision, _ = plan(inputs(20.0, (job(BATCH, batch=True),), {}), PlanState(), 0.0)
    desired, reason = decision_of(decision.targets, BATCH)
    # per node: 8 x 0.9 - 2 cpu used = 5.2 -> 5 trainers of 1 cpu
    assert desired == 10
    assert "batch capacity" in reason
    plain, _ = plan(inputs(20.0, (job(PLAIN, batch=False),), {}), PlanState(), 0.0)
    assert decision_of(plain.targets, PLAIN)[0] == 0


def test_rising_serving_usage_shrinks_batch_trainers_and_never_serving() -> None:
    bound = {"n0": 5, "n1": 5}
    quiet, _ = plan(inputs(20.0, (job(BATCH, batch=True),), bound), PlanState(), 0.0)
    busy, _ = plan(inputs(36.0, (job(BATCH, batch=True),), bound), PlanState(), 0.0)
    alone, _ = plan(inputs(36.0, (), {}), PlanState(), 0.0)
    quiet_count, _ = decision_of(quiet.targets, BATCH)
    busy_count, reason = decision_of(busy.targets, BATCH)
    # 36 rps: serving uses 0.9 x 0.5 of 8 cpu per node = 3.6; 7.2 - 3.6 = 3.6 -> 3 trainers
    assert quiet_count == 10
    assert busy_count == 6
    assert "must leave" in reason and "batch capacity" in reason
    # Serving's decision does not depend on the batch job at all.
    assert decision_of(busy.targets, WEB) == decision_of(alone.targets, WEB)
    # Batch trainers hold no requests: the plan's requested usage is serving's alone.
    assert busy.node_usage[:, 0].tolist() == alone.node_usage[:, 0].tolist()


def test_room_no_request_holds_goes_to_plain_jobs_not_batch() -> None:
    # A third, empty node: any pod (a new job, a serving scale-up) may bind there at once, so
    # batch trainers are not planned on it; a job on requests takes it.
    decision, _ = plan(inputs(20.0, (job(BATCH, batch=True),), {}, empty_nodes=1), PlanState(), 0.0)
    assert decision_of(decision.targets, BATCH)[0] == 10
    plain, _ = plan(inputs(20.0, (job(PLAIN, batch=False),), {}, empty_nodes=1), PlanState(), 0.0)
    assert decision_of(plain.targets, PLAIN)[0] == 8


def test_while_serving_scales_up_the_replicas_already_there_carry_the_demand() -> None:
    # Two of the four replicas are known so far: 20 rps on 20 rps of capacity, half of every
    # request busy: 8 x 0.5 idle per node, 7.2 - 4 = 3.2 -> 3 trainers per node.
    decision, _ = plan(
        inputs(20.0, (job(BATCH, batch=True),), {}, serving_current=2), PlanState(), 0.0
    )
    assert decision_of(decision.targets, BATCH)[0] == 6


def test_batch_grows_only_into_room_that_stayed_and_shrinks_at_once() -> None:
    jobs = (job(BATCH, batch=True),)
    state = PlanState()
    desired: list[int] = []
    bound: dict[str, int] = {}
    # (time, rps): quiet, a rise at 130 s, quiet again from 135 s
    for now, rps in [(0.0, 20.0), (60.0, 20.0), (120.0, 20.0), (130.0, 36.0), (135.0, 20.0)]:
        decision, state = plan(inputs(rps, jobs, bound, grow_after_s=120.0), state, now)
        count = decision_of(decision.targets, BATCH)[0]
        desired.append(count)
        bound = {"n0": count // 2, "n1": count - count // 2}
    # Nothing until the room has stayed 120 s; 3 per node as soon as the rise leaves 3.6 cpu;
    # the room coming back 5 s later is not lent again at once.
    assert desired == [0, 0, 10, 6, 6]
    decision, state = plan(inputs(20.0, jobs, bound, grow_after_s=120.0), state, 240.0)
    assert decision_of(decision.targets, BATCH)[0] == 6  # 130 s' low is in this period
    decision, _ = plan(inputs(20.0, jobs, bound, grow_after_s=120.0), state, 360.0)
    assert decision_of(decision.targets, BATCH)[0] == 10


def test_a_serving_scale_down_takes_its_share_of_room_from_every_node_it_leaves() -> None:
    # Which replicas go is the ReplicaSet controller's choice: going from 4 to 2, each node
    # keeps half of its serving requests to lend (4 of 8 cpu), not the plan's guess of which
    # node empties.
    scaled_down = inputs(20.0, (job(BATCH, batch=True),), {})
    staying = serving_staying(scaled_down, cluster_entries(scaled_down), [2])
    assert staying[:, 0].tolist() == [4.0, 4.0]
    assert serving_staying(scaled_down, cluster_entries(scaled_down), [4])[:, 0].tolist() == [
        8.0,
        8.0,
    ]


def test_room_serving_releases_waits_a_plan_for_jobs_on_requests_while_batch_jobs_run() -> None:
    # 10 rps needs 2 of the 4 replicas at once (no stabilisation window). Which two go is the
    # ReplicaSet controller's choice, so with a batch job the 8 cpu they release go to the
    # plain job only at the next plan, when the view shows where they were.
    shrinking = replace(web(), min_replicas=2, stabilization_s=0.0)
    both = (job(PLAIN, batch=False), job(BATCH, batch=True))
    decision, _ = plan(inputs(10.0, both, {}, serving=shrinking), PlanState(), 0.0)
    assert decision_of(decision.targets, WEB)[0] == 2
    assert decision_of(decision.targets, PLAIN)[0] == 0
    alone, _ = plan(inputs(10.0, both[:1], {}, serving=shrinking), PlanState(), 0.0)
    assert decision_of(alone.targets, PLAIN)[0] == 8


def test_trainers_that_must_leave_a_node_are_not_replaced_elsewhere_in_the_same_plan() -> None:
    # Six on n0, whose room holds five; n1's five are free. The executor removes trainers by
    # count where room is shortest, so one leaves now and n1 fills at the next plan.
    decision, _ = plan(inputs(20.0, (job(BATCH, batch=True),), {"n0": 6}), PlanState(), 0.0)
    desired, reason = decision_of(decision.targets, BATCH)
    assert desired == 5 and "must leave" in reason
    decision, _ = plan(inputs(20.0, (job(BATCH, batch=True),), {"n0": 5}), PlanState(), 15.0)
    assert decision_of(decision.targets, BATCH)[0] == 10


def test_trainers_stay_on_what_serving_leaves_now_and_grow_on_what_the_forecast_leaves() -> None:
    # 20 rps now, 36 forecast: 5.2 cpu per node are idle now, 3.6 until the next plan.
    jobs = (job(BATCH, batch=True),)
    placed = inputs(36.0, jobs, {"n0": 5, "n1": 5}, observed_rps=20.0)
    assert decision_of(plan(placed, PlanState(), 0.0)[0].targets, BATCH)[0] == 10
    empty = inputs(36.0, jobs, {}, observed_rps=20.0)
    assert decision_of(plan(empty, PlanState(), 0.0)[0].targets, BATCH)[0] == 6


def test_unknown_demand_lends_nothing() -> None:
    no_signal = inputs(20.0, (job(BATCH, batch=True),), {})
    no_signal = PlanInputs(
        cluster=no_signal.cluster,
        serving=no_signal.serving,
        jobs=no_signal.jobs,
        forecasts={},
        current=no_signal.current,
        config=no_signal.config,
    )
    decision, _ = plan(no_signal, PlanState(), 0.0)
    # Without a forecast serving counts as fully busy: 7.2 - 8 < 0 reclaimable on each node.
    assert decision_of(decision.targets, BATCH)[0] == 0


def test_batch_job_asking_for_gpus_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match=r"batch: GPUs are not lent.*0 gpu"):
        TrainingJob(BATCH, (1.0, GIB, 1.0), min_trainers=1, max_trainers=2, batch=True)
