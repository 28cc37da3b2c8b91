"""The planner's gauges (services/planner/metrics.py): what a plan saw and decided, per
workload, target and node, read back from the real prometheus_client registry."""

from __future__ import annotations

from prometheus_client import REGISTRY

from tideshift.services.planner import metrics
from tideshift.services.planner.core import (
    ClusterView,
    Decision,
    Forecast,
    NodeSpec,
    PlanInputs,
    PodSpec,
    ServingWorkload,
    Target,
    TargetDecision,
    TrainingJob,
)

GIB = 2**30
WEB = Target("prod", "Deployment", "web")
BATCH = Target("ml", "ElasticJob", "batch")
PLAIN = Target("ml", "ElasticJob", "plain")


def sample(metric: str, /, **labels: str) -> float | None:
    return REGISTRY.get_sample_value(metric, labels)


def plan_inputs(*, with_web: bool = True) -> tuple[PlanInputs, Decision]:
    nodes = [NodeSpec("n1", (8.0, 32 * GIB, 0.0)), NodeSpec("n2", (8.0, 32 * GIB, 0.0))]
    pods = [
        PodSpec((1.0, GIB, 0.0), node="n1", owner=BATCH),
        PodSpec((1.5, GIB, 0.0), node="n1", owner=BATCH),
        PodSpec((2.0, GIB, 0.0), node="n2", owner=PLAIN),  # not batch: lends nothing
        PodSpec((1.0, GIB, 0.0), node=None, owner=BATCH),  # unbound: on no node yet
        PodSpec((1.0, GIB, 0.0), node="n2"),  # unowned
    ]
    serving = (ServingWorkload(WEB, (1.0, GIB, 0.0), capacity_rps=50.0),) if with_web else ()
    forecast = Forecast(0.0, (0.0, 60.0, 120.0), {0.5: (10.0, 20.0, 30.0), 0.95: (15, 25, 35)})
    inputs = PlanInputs(
        cluster=ClusterView.build(nodes, pods),
        serving=serving,
        jobs=(
            TrainingJob(BATCH, (1.0, GIB, 0.0), min_trainers=1, max_trainers=9, batch=True),
            TrainingJob(PLAIN, (2.0, GIB, 0.0), min_trainers=1, max_trainers=9),
        ),
        forecasts={WEB: forecast},
        current={WEB: 3, BATCH: 3, PLAIN: 1},
        observed_rps={WEB: 123.0},
    )
    targets = [TargetDecision(BATCH, "training", 3, 4, "grow")]
    if with_web:
        targets.append(TargetDecision(WEB, "serving", 3, 5, "forecast"))
    return inputs, Decision(tuple(targets), (), (), inputs.cluster.allocatable * 0)


def test_a_plan_shows_demand_capacity_forecast_desired_and_lent() -> None:
    inputs, decision = plan_inputs()
    metrics.record(inputs, decision, now=70.0)

    web = {"namespace": "prod", "name": "web"}
    assert sample("tideshift_planner_demand_rps", **web) == 123.0
    assert sample("tideshift_planner_capacity_rps", **web) == 150.0
    # At 70 s the point stamped 60 s holds.
    assert sample("tideshift_planner_forecast_rps", **web, quantile="0.5") == 20.0
    assert sample("tideshift_planner_forecast_rps", **web, quantile="0.95") == 25.0
    assert sample("tideshift_planner_desired_replicas", **web, role="serving") == 5.0
    batch = {"namespace": "ml", "name": "batch", "role": "training"}
    assert sample("tideshift_planner_desired_replicas", **batch) == 4.0
    assert sample("tideshift_planner_lent_cpu_cores", node="n1") == 2.5
    assert sample("tideshift_planner_lent_cpu_cores", node="n2") == 0.0


def test_a_workload_that_leaves_the_plan_loses_its_series() -> None:
    metrics.record(*plan_inputs(), now=0.0)
    inputs, decision = plan_inputs(with_web=False)
    metrics.record(inputs, decision, now=0.0)

    web = {"namespace": "prod", "name": "web"}
    assert sample("tideshift_planner_demand_rps", **web) is None
    assert sample("tideshift_planner_capacity_rps", **web) is None
    assert sample("tideshift_planner_forecast_rps", **web, quantile="0.5") is None
    assert sample("tideshift_planner_desired_replicas", **web, role="serving") is None
    batch = {"namespace": "ml", "name": "batch", "role": "training"}
    assert sample("tideshift_planner_desired_replicas", **batch) == 4.0


def test_a_flood_that_leaves_the_plan_leaves_only_the_plan_s_series() -> None:
    """Past SERIES_REBUILD_SLACK gone label sets the gauge is started afresh (its client's
    table never shrinks): what stays is exactly the latest plan's."""
    inputs, decision = plan_inputs()
    flood = [
        TargetDecision(Target("soak", "Deployment", f"w-{i}"), "serving", 1, 2, "forecast")
        for i in range(metrics.SERIES_REBUILD_SLACK + 50)
    ]
    metrics.record(
        inputs, Decision((*decision.targets, *flood), (), (), decision.node_usage), now=0.0
    )
    assert (
        sample("tideshift_planner_desired_replicas", namespace="soak", name="w-7", role="serving")
        == 2.0
    )

    metrics.record(inputs, decision, now=0.0)

    desired = REGISTRY.get_sample_value
    assert all(
        desired(
            "tideshift_planner_desired_replicas",
            {"namespace": "soak", "name": f"w-{i}", "role": "serving"},
        )
        is None
        for i in range(len(flood))
    )
    assert (
        sample("tideshift_planner_desired_replicas", namespace="prod", name="web", role="serving")
        == 5.0
    )
    assert (
        sample("tideshift_planner_desired_replicas", namespace="ml", name="batch", role="training")
        == 4.0
    )
