"""The scenario `tideshift whatif` builds from a cluster's nodes and labelled workloads
(services/whatif/scenario.py), and the sentence it leads its report with."""

from __future__ import annotations

from datetime import UTC, datetime

from tideshift.events import Resources, ServingPolicy, TrainingPolicy, WorkloadChanged, WorkloadRef
from tideshift.services.cluster.port import Node
from tideshift.services.cluster.port import Resources as NodeResources
from tideshift.services.simulator.run import PolicyResult
from tideshift.services.whatif.cli import headline
from tideshift.services.whatif.scenario import Replay, build_scenario

GIB = 2**30
NOW = datetime(2026, 1, 1, tzinfo=UTC)


def node(name: str, cpu: float, *, gpu: int = 0, cordoned: bool = False) -> Node:
    return Node(name, NodeResources(cpu, 32 * GIB, gpu), unschedulable=cordoned)


def serving(namespace: str, name: str, **policy: object) -> WorkloadChanged:
    return WorkloadChanged(
        change="added",
        workload=WorkloadRef(namespace, "Deployment", name),
        role="serving",
        replicas=2,
        requests=Resources(cpu=0.5, memory=GIB),
        serving=ServingPolicy.model_validate({"capacity_rps": 40, **policy}),
        observed_at=NOW,
    )


def training(name: str, **policy: object) -> WorkloadChanged:
    return WorkloadChanged(
        change="added",
        workload=WorkloadRef("ml", "PyTorchJob.kubeflow.org", name),
        role="training",
        replicas=3,
        max_replicas=12,
        requests=Resources(cpu=4, memory=8 * GIB, gpu=1),
        training=TrainingPolicy.model_validate(policy),
        observed_at=NOW,
    )


def test_nodes_group_by_shape_and_workloads_keep_their_annotations_policy() -> None:
    web = serving("shop", "web", max_replicas=30, lead_time_seconds=90, quantile=0.9)
    api = serving("shop", "api")
    scenario = build_scenario(
        name="whatif",
        nodes=[node("a", 8), node("b", 8), node("g", 16, gpu=4), node("c", 8, cordoned=True)],
        workloads=[web, api, training("ctr", min_replicas=2, gang_min=2, priority=5)],
        replays={web.workload: Replay("traces/web.csv", 86_400.0)},
        duration_s=14 * 86_400,
        step_s=60,
        history_s=86_400,
        model="tidal",
    )
    groups = [(g.count, g.cpu, g.memory_gib, g.gpu) for g in scenario.nodes]
    assert groups == [(2, 8, 32, 0), (1, 16, 32, 4)]  # the cordoned node is left out
    (spec,) = scenario.serving  # api has no replay: left out
    assert (spec.name, spec.namespace, spec.capacity_rps, spec.target_utilization) == (
        "web", "shop", 40, 1.0,
    )  # fmt: skip
    assert (spec.max_replicas, spec.lead_time_s, spec.startup_delay_s, spec.quantile) == (
        30, 90, 90, 0.9,
    )  # fmt: skip
    assert spec.replica.cpu == 0.5 and spec.replica.memory_gib == 1
    assert spec.traffic.kind == "trace" and spec.traffic.start_s == 86_400
    (job,) = scenario.training.jobs
    assert (job.name_prefix, job.min_trainers, job.max_trainers, job.gang_min) == ("ctr", 2, 12, 2)
    assert (job.trainer.cpu, job.trainer.gpu, job.priority, job.work) == (4, 1, 5, None)
    assert scenario.forecaster.model == "tidal" and scenario.forecaster.history_s == 86_400
    assert scenario.plan_interval_s == 60


def test_a_serving_workload_keeps_its_margin_and_target_utilisation() -> None:
    web = serving("shop", "web", margin_seconds=15, target_utilization=0.8)
    scenario = build_scenario(
        name="whatif",
        nodes=[node("a", 8)],
        workloads=[web],
        replays={web.workload: Replay("traces/web.csv", 0.0)},
        duration_s=3600,
        step_s=60,
        history_s=0,
        model=None,
    )
    (spec,) = scenario.serving
    assert (spec.margin_s, spec.target_utilization) == (15, 0.8)
    assert spec.capacity_rps == 40 / 0.8  # at 100 %: what the replica serves at its target
    assert spec.policy() == web.serving  # planned as the labelled workload would be


def test_workloads_sharing_a_name_across_namespaces_get_distinct_names() -> None:
    shop, blog = serving("shop", "web"), serving("blog", "web")
    scenario = build_scenario(
        name="whatif",
        nodes=[node("a", 8)],
        workloads=[shop, blog],
        replays={w.workload: Replay("traces/x.csv", 0.0) for w in (shop, blog)},
        duration_s=3600,
        step_s=60,
        history_s=0,
        model=None,
    )
    assert sorted(s.name for s in scenario.serving) == ["blog-web", "shop-web"]


def result(name: str, *, cpu: float, short: int, work: float) -> PolicyResult:
    return PolicyResult(
        name, {"cpu": cpu}, short, 0.0, cpu, {}, 0, 0.0, 0, work, 0.0, 0.0, 0, 0.0, 0, 0, 0, 1.0
    )


def test_the_headline_puts_tideshift_beside_each_baseline() -> None:
    results = [
        result("tideshift", cpu=0.61, short=3, work=5400),
        result("static", cpu=0.42, short=0, work=2100),
        result("hpa", cpu=0.48, short=95, work=3000),
    ]
    assert headline(results, "14d") == (
        "On your last 14d, Tideshift would have used 61.0% of the cluster's cpu (static 42.0%, "
        "hpa 48.0%), left serving short for 3 min (static 0, hpa 95) and done 5400 units of "
        "training work (static 2100, hpa 3000)."
    )
    assert headline(results[1:], "14d") == ""
