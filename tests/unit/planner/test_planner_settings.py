"""The planner's settings expose every `PolicyConfig` tunable under its own name, default and
meaning: on the command line, in the environment, in the chart's values and schema."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import BaseModel

from tideshift.events.models import ServingPolicy, TrainingPolicy
from tideshift.services.planner import core as pol
from tideshift.services.planner.service import main
from tideshift.services.planner.settings import (
    SERVING_SPEC_NAMES,
    TRAINING_SPEC_NAMES,
    PlannerSettings,
    ServingTarget,
    TrainingTarget,
)

CHART = Path(__file__).resolve().parents[3] / "charts" / "tideshift"
DEFAULTS = pol.PolicyConfig()
# Nested tunables set under another name: the lending margin is the lending section's, the one
# the executor advertises with.
SETTING_OF = {"overcommit_margin": "lend_margin"}


def tunables(config: Any = DEFAULTS, prefix: str = "") -> dict[str, Any]:
    """Every tunable of a policy config under its setting's name (a nested config's as
    `<field>_<its field>` unless `SETTING_OF` names it)."""
    found: dict[str, Any] = {}
    for spec in dataclasses.fields(config):
        value = getattr(config, spec.name)
        if dataclasses.is_dataclass(value):
            found |= tunables(value, f"{prefix}{spec.name}_")
        else:
            path = f"{prefix}{spec.name}"
            found[SETTING_OF.get(path, path)] = value
    return found


def test_every_tunable_is_a_setting_with_the_policys_default() -> None:
    settings = PlannerSettings(health_port=-1)
    for name, default in tunables().items():
        assert name in PlannerSettings.model_fields, name
        assert getattr(settings, name) == default, name
    assert settings.policy_config() == DEFAULTS


def test_help_lists_every_tunable(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["--help"])
    assert exit_info.value.code == 0
    shown = capsys.readouterr().out
    for name in tunables():
        assert f"--{name.replace('_', '-')}" in shown, name


def test_every_tunable_is_settable_by_flag_and_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("TIDESHIFT_RELEASE_HORIZON_S", "120")
    settings = PlannerSettings(
        _cli_parse_args=["--miss-tolerance", "0.2", "--lend-margin", "0.3"],  # type: ignore[call-arg]
        health_port=-1,
    )
    config = settings.policy_config()
    assert config.release_horizon_s == 120.0
    assert config.miss_tolerance == 0.2
    assert config.overcommit.margin == 0.3


def test_a_tunable_out_of_the_policys_bounds_is_refused() -> None:
    with pytest.raises(ValueError, match="rebalance_floor"):
        PlannerSettings(health_port=-1, rebalance_floor=0.0)


def test_the_chart_documents_every_tunable_with_its_default() -> None:
    chart_values = yaml.safe_load((CHART / "values.yaml").read_text())
    # The lending margin is chart-wide (`lending`): the planner and the executor read one value.
    values = chart_values["planner"]["config"] | chart_values["lending"]
    schema = json.loads((CHART / "values.schema.json").read_text())["properties"]
    properties = (
        schema["planner"]["properties"]["config"]["properties"] | schema["lending"]["properties"]
    )
    for name, default in tunables().items():
        assert values[name] == default, name
        assert properties[name]["description"], name


@pytest.mark.parametrize(
    ("target", "spec", "names"),
    [
        (ServingTarget, ServingPolicy, SERVING_SPEC_NAMES),
        (TrainingTarget, TrainingPolicy, TRAINING_SPEC_NAMES),
    ],
)
def test_a_targets_spec_fields_are_the_workload_specs(
    target: type[BaseModel], spec: type[BaseModel], names: dict[str, str]
) -> None:
    """Defaults, bounds and meaning come from the one workload spec (max_trainers excepted:
    a listed job has no bound of its own, so it is required)."""
    for field, spec_field in names.items():
        mine, theirs = target.model_fields[field], spec.model_fields[spec_field]
        assert mine.metadata == theirs.metadata, field  # the bounds
        if field != "max_trainers":
            assert mine.default == theirs.default, field
            assert mine.description == theirs.description, field


def test_targets_build_through_the_specs() -> None:
    serving = ServingTarget(
        namespace="shop", name="web", cpu=0.5, capacity_rps=40, margin_s=30, target_utilization=0.8
    )
    assert serving.workload() == pol.ServingWorkload.of(
        pol.Target("shop", "Deployment", "web"),
        (0.5, 0.0, 0.0),
        ServingPolicy(capacity_rps=40, margin_seconds=30, target_utilization=0.8),
    )
    training = TrainingTarget(namespace="ml", name="ctr", cpu=4, max_trainers=8, gang_min=2)
    job = training.job(3.0)
    assert job == pol.TrainingJob.of(
        pol.Target("ml", "PyTorchJob", "ctr"),
        (4.0, 0.0, 0.0),
        TrainingPolicy(max_replicas=8, gang_min=2),
        min_trainers=1,
        max_trainers=8,
        submitted_at=3.0,
    )
    assert (job.restart_cost_s, job.speedup_exponent) == TrainingPolicy().work_model


def test_a_target_with_its_bounds_out_of_order_is_refused() -> None:
    with pytest.raises(ValueError, match="min-replicas 5 above max-replicas 2"):
        ServingTarget(
            namespace="shop", name="web", cpu=1, capacity_rps=10, min_replicas=5, max_replicas=2
        )
