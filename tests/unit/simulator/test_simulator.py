"""`tideshift simulate`: scenario validation, trace validation, a small run end to end."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tideshift.services.simulator import cli as simulate
from tideshift.services.simulator.scenario import ScenarioError, load_trace, parse_scenario

REPO = Path(__file__).resolve().parents[3]
SHIPPED = sorted((REPO / "loadgen" / "scenarios").glob("*.yaml"))

SMALL = """
name: small
duration_s: 600
step_s: 5
plan_interval_s: 10
forecaster: {kind: oracle}
nodes:
  - {count: 4, cpu: 8, memory_gib: 32}
serving:
  - name: web
    replica: {cpu: 1, memory_gib: 1}
    capacity_rps: 10
    target_utilization: 0.8
    min_replicas: 1
    max_replicas: 30
    startup_delay_s: 10
    stabilization_s: 60
    traffic: {kind: points, points: [[0, 40], [200, 160], [400, 40]]}
training:
  jobs:
    - {name_prefix: job, count: 2, interval_s: 30, trainer: {cpu: 1, memory_gib: 1},
       min_trainers: 1, max_trainers: 30, nominal_trainers: 4, pservers: 1,
       pserver: {cpu: 1, memory_gib: 1}, startup_delay_s: 5}
"""


@pytest.mark.parametrize(
    ("text", "field"),
    [
        (SMALL.replace("duration_s: 600", "duration_s: -1"), "duration_s"),
        (SMALL.replace("capacity_rps: 10", "capacity_rps: zero"), "serving.0.capacity_rps"),
        (SMALL.replace("kind: points", "kind: sine"), "serving.0.traffic"),
        (SMALL.replace("max_trainers: 30", "max_trainers: 0"), "training.jobs.0.max_trainers"),
        (SMALL.replace("name: small", "name: small\nnodez: []"), "nodez"),
        (SMALL.replace("min_replicas: 1", "min_replicas: 50"), "serving.0"),
        (
            SMALL.replace("[[0, 40], [200, 160], [400, 40]]", "[[0, 40], [0, 160]]"),
            "serving.0.traffic.points",
        ),
    ],
)
def test_invalid_scenarios_name_the_field(text: str, field: str) -> None:
    with pytest.raises(ScenarioError) as error:
        parse_scenario(text, "s.yaml")
    assert field in str(error.value)


def test_not_yaml_is_reported() -> None:
    with pytest.raises(ScenarioError, match="not valid YAML"):
        parse_scenario("a: [1, 2", "s.yaml")


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("time,requests\n0,1\n60,2\n", "line 1: expected the header"),
        ("timestamp_s,requests\n0,1\n60,x\n", "line 3: expected two numbers"),
        ("timestamp_s,requests\n0,1\n60,-2\n", "line 3: requests must be a finite count >= 0"),
        ("timestamp_s,requests\n0,1\n0,2\n", "line 3: timestamp_s must increase"),
        ("timestamp_s,requests\n0,1,3\n", "line 2: expected 2 fields"),
        ("timestamp_s,requests\n0,1\n", "at least 2 data rows"),
        ("timestamp_s,requests\n0,1\n60,2\n180,3\n", "line 4: irregular step"),
    ],
)
def test_trace_lines_are_validated(tmp_path: Path, content: str, message: str) -> None:
    path = tmp_path / "trace.csv"
    path.write_text(content)
    with pytest.raises(ScenarioError, match=message):
        load_trace(path)


def test_trace_missing_points_to_the_override(tmp_path: Path) -> None:
    with pytest.raises(ScenarioError, match="--trace-dir"):
        load_trace(tmp_path / "missing.csv")


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: p.name)
def test_shipped_scenarios_parse(path: Path) -> None:
    scenario = parse_scenario(path.read_text(), str(path))
    assert scenario.duration_s > 0


def test_trace_path_resolves_relative_to_the_scenario_or_the_override(tmp_path: Path) -> None:
    path = REPO / "loadgen" / "scenarios" / "day-night-nasa.yaml"
    scenario = parse_scenario(path.read_text(), str(path))
    traffic = scenario.serving[0].traffic
    assert traffic.kind == "trace"
    resolved = traffic.resolve(path.parent, None)
    assert resolved.resolve() == (REPO.parent / "shared" / "traces" / resolved.name).resolve()
    assert traffic.resolve(path.parent, tmp_path) == tmp_path / resolved.name


def test_simulate_json_has_exactly_the_documented_keys(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    scenario = tmp_path / "small.yaml"
    scenario.write_text(SMALL)
    code = simulate.main(
        [
            "--scenario",
            str(scenario),
            "--json",
            "--policy",
            "tideshift",
            "--policy",
            "hpa",
            "--out",
            str(tmp_path / "plots"),
        ]
    )
    assert code == 0
    result = json.loads(capsys.readouterr().out)
    assert set(result) == {"policies"}
    # The clairvoyant bound runs beside any choice, for the fractions of its figures.
    assert set(result["policies"]) == {"tideshift", "hpa", "oracle"}
    for metrics in result["policies"].values():
        assert set(metrics) == {
            "utilization",
            "shortfall_minutes",
            "shortfall_fraction",
            "cpu_used",
            "stranded",
            "serving_starved_minutes",
            "cpu_batch",
            "batch_evictions",
            "training_work",
            "pending_mean_s",
            "pending_p95_s",
            "trainer_churn",
            "churn_causes",
            "weighted_work",
            "over_provisioning",
            "cpu_shares",
            "jobs",
            "serving_replica_hours",
            "serving_replica_hours_vs_minimum",
            "training_work_vs_oracle",
            "serving_replica_hours_vs_oracle",
            "churn_vs_oracle",
            "job_hours_left_behind",
            "job_hours_left_behind_by_job",
        }
        assert set(metrics["over_provisioning"]) == {"web"}
        assert set(metrics["cpu_shares"]) == {"training", "serving_reserved", "serving_used"}
        assert set(metrics["churn_causes"]) == {"jobs", "serving", "rebalancing"}
        assert sum(metrics["churn_causes"].values()) == metrics["trainer_churn"]
        assert set(metrics["utilization"]) == {"cpu", "memory"}
        assert set(metrics["stranded"]) == {"cpu"}
        # serving's idle reservation is counted: used cpu is below requested cpu
        assert 0 < metrics["cpu_used"] < metrics["utilization"]["cpu"]
        assert metrics["serving_starved_minutes"] == 0
    assert sorted(p.name for p in (tmp_path / "plots").iterdir()) == [
        "small-hpa.png",
        "small-oracle.png",
        "small-tideshift.png",
    ]
    tideshift = result["policies"]["tideshift"]
    assert tideshift["shortfall_minutes"] == 0  # the oracle sees the rise at t=200 coming
    assert tideshift["training_work"] > result["policies"]["hpa"]["training_work"]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--policy", "nope"], "--policy"),
        (["--duration", "0"], "--duration"),
    ],
)
def test_bad_arguments_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    scenario = tmp_path / "small.yaml"
    scenario.write_text(SMALL)
    with pytest.raises(SystemExit) as exit_info:
        simulate.main(["--scenario", str(scenario), *argv])
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err


def test_invalid_scenario_file_exits_2_naming_the_field(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    scenario = tmp_path / "bad.yaml"
    scenario.write_text(SMALL.replace("capacity_rps: 10", "capacity_rps: -3"))
    assert simulate.main(["--scenario", str(scenario)]) == 2
    assert "serving.0.capacity_rps" in capsys.readouterr().err
