"""The settings the demo hands the services are valid for those services (no flag drift)."""

from __future__ import annotations

import pytest

from tideshift.services.common.settings import parse_settings
from tideshift.services.demo import pipeline
from tideshift.services.demo.world import LENDING_JOB, JobShape, ServingShape, WorldShape
from tideshift.services.planner import settings as planner_settings
from tideshift.services.predictor.settings import PredictorSettings


def test_planner_targets_describe_the_world() -> None:
    world = WorldShape(jobs=(*WorldShape().jobs, LENDING_JOB))
    targets = pipeline.planner_targets(world, speed=288.0)
    (serving,) = targets["serving"]
    assert serving.capacity_rps == pytest.approx(50.0 * 0.8)  # at the target utilisation
    assert serving.target_utilization == 0.8  # what a replica uses there: the rest is lent
    assert serving.margin_s == pytest.approx(288.0 * pipeline.LAG_BUDGET_WALL_S)
    assert [t.name for t in targets["training"]] == ["ctr-a", "ctr-b", "ctr-c", "ctr-lend"]
    for target, job in zip(targets["training"], world.jobs, strict=True):
        assert target.kind == "ElasticJob"
        assert target.max_trainers == job.max_trainers
        assert target.batch == job.batch
    assert [t.name for t in targets["training"] if t.batch] == ["ctr-lend"]
    assert targets["lend_margin"] == world.lend_margin
    # the sim names parameter servers <job>-ps<n>; trainers <job>-t<n> must not match
    markers = targets["training"][0].companion_markers
    assert any(m in "ctr-a-ps7" for m in markers)
    assert not any(m in "ctr-a-t12" for m in markers)


def test_planner_timing_runs_the_loop_every_interval_of_wall_time() -> None:
    timing = pipeline.planner_timing(speed=720.0, interval_wall_s=0.5)
    assert timing["tick_seconds"] == pytest.approx(360.0)  # clock seconds
    settings = planner_settings.PlannerSettings(health_port=-1, **timing)
    assert settings.max_forecast_age_s >= 720.0 * 5  # several predictor refreshes


def test_observed_demand_reaches_every_plan_fresh() -> None:
    """The planner's safety net and its batch room use observed demand only while fresh: the
    predictor observes once per plan (clock seconds), and a few misses are tolerated."""
    speed, plan_wall_s = 288.0, 0.5
    planner = planner_settings.PlannerSettings(
        health_port=-1, **pipeline.planner_timing(speed=speed, interval_wall_s=plan_wall_s)
    )
    predictor = pipeline.predictor_settings_for(
        WorldShape(), interval_s=speed * 1.0, observe_s=speed * plan_wall_s
    )
    assert predictor.observe_seconds == pytest.approx(planner.tick_seconds)
    assert 2 * predictor.observe_seconds <= planner.observed_max_age_seconds


@pytest.mark.parametrize("name", ["predictor", "planner"])
def test_real_cluster_flags_parse(name: str) -> None:
    serving = ServingShape(namespace="demo-x", capacity_rps=10.0, max_replicas=30)
    jobs = [JobShape("ctr-a", namespace="demo-x", kind="StatefulSet")]
    argv = pipeline.kube_service_args(
        name,
        prometheus_url="http://127.0.0.1:9090",
        namespace="demo-x",
        app="web",
        serving=serving,
        jobs=jobs,
    )
    settings_class = PredictorSettings if name == "predictor" else planner_settings.PlannerSettings
    settings = parse_settings(settings_class, argv, prog=f"tideshift run {name}")
    if isinstance(settings, PredictorSettings):
        assert settings.workloads[0].name == "web"
        assert settings.metric_source == "prometheus"
    else:
        assert settings.serving[0].namespace == "demo-x"
        assert settings.training[0].kind == "StatefulSet"
