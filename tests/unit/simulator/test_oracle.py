"""The clairvoyant bound (`simulate --policy oracle`, services/simulator/oracle.py): never short
of serving, on smooth, stepped, spiky and surging demand, and the yardstick of every report."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from tideshift.loadgen.core import families
from tideshift.loadgen.core.profiles import RateProfile
from tideshift.services.simulator import cli as simulate
from tideshift.services.simulator.cli import load_profiles
from tideshift.services.simulator.oracle import ORACLE, TruthForecaster, ratio
from tideshift.services.simulator.run import compare_to_oracle, run_policy
from tideshift.services.simulator.scenario import Scenario, load_scenario, parse_scenario

BASE = """
name: {name}
duration_s: {duration}
step_s: 10
plan_interval_s: 30
forecaster: {{kind: oracle}}
nodes:
  - {{count: 4, cpu: 8, memory_gib: 32}}
serving:
  - name: web
    replica: {{cpu: 1, memory_gib: 1}}
    capacity_rps: 10
    target_utilization: 0.8
    min_replicas: 1
    max_replicas: 24
    startup_delay_s: 30
    stabilization_s: 120
    traffic: {traffic}
training:
  jobs:
    - {{name_prefix: job, count: 2, interval_s: 60, trainer: {{cpu: 1, memory_gib: 1}},
       min_trainers: 1, max_trainers: 24, nominal_trainers: 4, startup_delay_s: 5}}
"""

TRAFFIC = {
    # a step up and back down, sharper than any reaction
    "steps": "{kind: points, points: [[0, 20], [900, 150], [1500, 30], [2400, 170]]}",
    # spikes of a few minutes at 3-6x, jittered, every 1-3 h (the spiky family)
    "spiky": "{kind: family, family: periodic_spikes, seed: 4, history_s: 3600, "
    "duration_s: 14400, amplitude: 0.06}",
    # surges of random size at random times
    "surges": "{kind: family, family: flash_crowds, seed: 4, history_s: 3600, "
    "duration_s: 14400, amplitude: 2.5}",
    # a noisy daily curve, compressed to two hours
    "noisy": "{kind: diurnal, base_rps: 10, peak_rps: 160, period_s: 7200, noise: 0.3, "
    "noise_step_s: 60}",
}


def _scenario(name: str, duration: float) -> tuple[Scenario, list[RateProfile]]:
    text = BASE.format(name=name, duration=duration, traffic=TRAFFIC[name])
    scenario = parse_scenario(text, f"{name}.yaml")
    return scenario, load_profiles(scenario, Path(f"{name}.yaml"), None)


@pytest.mark.parametrize("name", sorted(TRAFFIC))
def test_oracle_is_never_short_of_serving(name: str) -> None:
    scenario, profiles = _scenario(name, 3 * 3600.0)
    demand = [profile.rate(t) for profile in profiles for t in range(0, 3 * 3600, 10)]
    assert max(demand) > 3 * max(min(demand), 1.0)  # the demand does move
    result = run_policy(scenario, profiles, ORACLE)
    assert result.shortfall_minutes == 0
    assert result.shortfall_fraction == 0.0
    assert result.serving_starved_minutes == 0
    assert result.training_work > 0  # training got the rest


def test_every_policy_is_reported_against_the_oracle() -> None:
    scenario, profiles = _scenario("steps", 3600.0)
    results = [run_policy(scenario, profiles, name) for name in ("edl", ORACLE)]
    compare_to_oracle(results)
    edl, oracle = results
    assert oracle.vs_oracle == {
        "training_work_vs_oracle": 1.0,
        "serving_replica_hours_vs_oracle": 1.0,
        "churn_vs_oracle": 1.0,
    }
    assert edl.vs_oracle["training_work_vs_oracle"] == pytest.approx(
        edl.training_work / oracle.training_work
    )
    assert edl.vs_oracle["serving_replica_hours_vs_oracle"] == pytest.approx(
        edl.serving_replica_h / oracle.serving_replica_h
    )
    # Never short, the oracle holds at least the reachable minimum (more: it looks a lead
    # time ahead and keeps room that comes back within the release horizon).
    assert oracle.over_minimum >= 1.0
    assert edl.shortfall_minutes > 0  # EDL-like's HPA reacts after the steps
    assert oracle.shortfall_minutes == 0


def test_simulate_runs_the_oracle_for_the_fractions(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "steps.yaml"
    path.write_text(BASE.format(name="steps", duration=1200, traffic=TRAFFIC["steps"]))
    assert simulate.main(["--scenario", str(path), "--json", "--policy", "hpa"]) == 0
    policies = json.loads(capsys.readouterr().out)["policies"]
    assert set(policies) == {"hpa", ORACLE}
    hpa, oracle = policies["hpa"], policies[ORACLE]
    assert oracle["shortfall_minutes"] == 0
    for key, figure in (
        ("training_work_vs_oracle", "training_work"),
        ("churn_vs_oracle", "trainer_churn"),
        ("serving_replica_hours_vs_oracle", "serving_replica_hours"),
    ):
        assert oracle[key] == 1.0
        # the JSON figures are rounded; NaN (null in JSON) when there is no ratio
        expected = ratio(hpa[figure], oracle[figure])
        assert hpa[key] == (None if math.isnan(expected) else pytest.approx(expected, rel=0.01))
    assert simulate.main(["--scenario", str(path), "--policy", "hpa", "--no-oracle"]) == 0
    text = capsys.readouterr().out
    assert "work/oracle" not in text and "\noracle " not in text


def test_truth_forecaster_reads_the_future_at_every_step() -> None:
    _, profiles = _scenario("steps", 3600.0)
    forecaster = TruthForecaster(profiles[0], 10.0, 600.0)
    forecast = forecaster.forecast(895.0)
    assert forecast.times[0] == 890.0 and forecast.times[1] == 900.0
    values = set(forecast.quantiles.values())
    assert len(values) == 1  # every quantile is the truth
    (truth,) = values
    assert truth[0] == profiles[0].rate(890.0) and truth[1] == profiles[0].rate(900.0)
    assert ratio(0.0, 0.0) == 1.0 and ratio(2.0, 4.0) == 0.5


def test_held_out_scenarios_and_families_are_marked() -> None:
    shipped = Path(__file__).resolve().parents[3] / "loadgen" / "scenarios"
    marks = {path.stem: load_scenario(path).evaluation for path in shipped.glob("*.yaml")}
    held = {name for name, mark in marks.items() if mark == "held-out"}
    assert held == {name for name in marks if name.startswith("heldout-")}
    assert len(held) >= 7 and "family-periodic-spikes" not in held
    assert {"jittered_spikes", "drifting_schedule", "noise_bursts", "missing_data"} <= set(
        families.held_out()
    )
    assert "periodic_spikes" not in families.held_out()
    for name in families.held_out():
        series = families.generate(name, seed=1, duration_s=2 * 86_400.0, interval_s=60.0)
        assert series.counts.shape == (2 * 1440,) and float(series.counts.max()) > 0
