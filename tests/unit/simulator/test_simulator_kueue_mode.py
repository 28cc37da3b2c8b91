"""`simulate --training-through kueue` (modelled): Kueue admits whole jobs into the quota the
lender leaves, by priority, and preempts in its order when serving's rise shrinks the quota."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from tideshift.services.cluster.core.kueue_quota import QuotaConfig
from tideshift.services.simulator.cli import load_profiles, main
from tideshift.services.simulator.kueue_mode import run_kueue
from tideshift.services.simulator.scenario import Scenario


def scenario() -> Scenario:
    """32 cpu; serving at 1 cpu per 10 req/s: 4 replicas until t=1800, then 28 (a peak)."""
    job = {"trainer": {"cpu": 2, "memory_gib": 1}, "max_trainers": 4, "startup_delay_s": 0}
    return Scenario.model_validate(
        {
            "name": "kueue-mode",
            "duration_s": 3600,
            "plan_interval_s": 60,
            "forecaster": {"kind": "oracle"},
            "nodes": [{"count": 2, "cpu": 16, "memory_gib": 64}],
            "serving": [
                {
                    "name": "web",
                    "replica": {"cpu": 1, "memory_gib": 1},
                    "capacity_rps": 10,
                    "target_utilization": 1.0,
                    "min_replicas": 1,
                    "max_replicas": 64,
                    "traffic": {
                        "kind": "points",
                        "points": [[0, 40], [1799, 40], [1800, 280], [3600, 280]],
                    },
                }
            ],
            "training": {
                "restart_cost_s": 0,
                "jobs": [
                    {**job, "name_prefix": "high", "count": 1, "priority": 10},
                    {**job, "name_prefix": "low", "count": 2, "priority": 0},
                ],
            },
        }
    )


def test_kueue_admits_whole_jobs_and_preempts_the_lowest_priority_for_serving() -> None:
    s = scenario()
    result = run_kueue(s, load_profiles(s, Path("."), None), lead_s=600,
                       config=QuotaConfig(min_interval_s=0))  # fmt: skip
    first = result.series[0]
    # 32 - 4 cpu lent at first: all three 8-cpu jobs admitted.
    assert (first["quota"], first["admitted"]) == (28, 24)
    # 10 minutes before the peak the quota is 32 - 28 = 4: no 8-cpu job fits, all go.
    before_peak = next(p for p in result.series if p["t"] == 1200)
    assert before_peak["quota"] == 4 and before_peak["admitted"] == 0
    assert result.preemptions == 3
    # Serving never short: every job gave its room back before the rise.
    assert result.serving_starved_minutes == 0
    assert all(p["admitted"] + p["serving"] <= 32 for p in result.series)
    assert result.lost_work > 0 and result.training_work > 0


def test_the_lowest_priority_goes_first_when_the_quota_shrinks_a_little() -> None:
    s = scenario()
    s.serving[0].traffic.points[2:] = [(1800, 120), (3600, 120)]  # type: ignore[union-attr]
    result = run_kueue(s, load_profiles(s, Path("."), None), lead_s=600,
                       config=QuotaConfig(min_interval_s=0))  # fmt: skip
    # 32 - 12 = 20 cpu: two jobs stay (the high one among them), one low one goes.
    late = result.series[-1]
    assert (late["quota"], late["admitted"]) == (20, 16)
    assert result.preemptions == 1


def test_simulate_prints_the_kueue_mode_beside_the_policies(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "kueue.yaml"
    path.write_text(yaml.safe_dump(scenario().model_dump(mode="json", exclude_none=True)))
    argv = ["--scenario", str(path), "--policy", "static", "--no-oracle", "--duration", "600",
            "--json", "--training-through", "kueue"]  # fmt: skip
    assert main(argv) == 0
    document = json.loads(capsys.readouterr().out)
    assert set(document) == {"policies", "kueue"}
    assert document["kueue"]["training_work"] > 0
    assert document["kueue"]["serving_starved_minutes"] == 0
