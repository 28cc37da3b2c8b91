"""Batch capacity in the policy: opted-in jobs are planned on what serving reserves but does
not use, and shrink first when serving's usage rises."""

from __future__ import annotations

import pytest

from tideshift.services.cluster.overcommit import OvercommitConfig
from tideshift.services.planner.policy import (
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

GIB = 2**30
WEB = Target("prod", "Deployment", "web")
BATCH = Target("ml", "ElasticJob", "batch")
PLAIN = Target("ml", "ElasticJob", "plain")


def flat_forecast(rps: float) -> Forecast:
    times = tuple(60.0 * i for i in range(60))
    return Forecast(0.0, times, {0.9: tuple(rps for _ in times)})


def web() -> ServingWorkload:
    # 10 rps per replica at a 50 % target utilisation: a replica at capacity uses half its cpu.
    return ServingWorkload(
        WEB,
        (4.0, GIB, 0.0),
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


def inputs(rps: float, jobs: tuple[TrainingJob, ...], trainers: dict[str, int]) -> PlanInputs:
    """Two 8-cpu nodes, each holding two serving replicas (all of its cpu requested);
    `trainers` bound batch trainers (zero requests, as the API shows them) per node."""
    nodes = [NodeSpec(f"n{i}", (8.0, 64.0 * GIB, 0.0)) for i in range(2)]
    pods = [PodSpec((4.0, GIB, 0.0), f"n{i % 2}", WEB) for i in range(4)]
    pods += [
        PodSpec((0.0, 0.0, 0.0), node, BATCH)
        for node, count in trainers.items()
        for _ in range(count)
    ]
    return PlanInputs(
        cluster=ClusterView.build(nodes, pods),
        serving=(web(),),
        jobs=jobs,
        forecasts={WEB: flat_forecast(rps)},
        current={WEB: 4, BATCH: sum(trainers.values())},
        config=PolicyConfig(overcommit=OvercommitConfig(margin=0.1), min_trainer_lifetime_s=0.0),
        observed_rps={WEB: rps},
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
