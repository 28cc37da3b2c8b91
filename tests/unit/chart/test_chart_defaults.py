"""The defaults documented in values.yaml are the services' own defaults, and the environment
the chart renders from them parses back into exactly those settings."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import TypeAdapter

from tests.unit.chart.chart_support import (
    CHART,
    SERVICES,
    by_kind,
    component,
    container_env,
    load_schema_builder,
    render,
)
from tideshift.services.common.settings import LendingSettings, ServiceSettings

BUILDER = load_schema_builder()
VALUES: dict[str, Any] = yaml.safe_load((CHART / "values.yaml").read_text())
SHARED_FIELDS = set(ServiceSettings.model_fields) - BUILDER.CHART_MANAGED_SETTINGS
LENDING_FIELDS = BUILDER.lending_fields()


def settings_of(service: str) -> type[ServiceSettings]:
    """The service's settings class; a renamed or missing one fails (the chart would drift)."""
    model = BUILDER.settings_class(service)
    if model is None:
        pytest.fail(f"the chart's schema builder finds no settings class in services/{service}")
    return model  # type: ignore[no-any-return]


def default_of(model: type[ServiceSettings], name: str) -> Any:
    return model.model_fields[name].get_default(call_default_factory=True)


def as_setting(model: type[ServiceSettings], name: str, value: Any) -> Any:
    """A values.yaml value as the field's type (YAML has lists where settings have tuples)."""
    return TypeAdapter(model.model_fields[name].annotation).validate_python(value)


def test_shared_config_lists_every_shared_setting_with_its_default() -> None:
    assert set(VALUES["config"]) == SHARED_FIELDS
    for name, value in VALUES["config"].items():
        assert as_setting(ServiceSettings, name, value) == default_of(ServiceSettings, name), name


def test_lending_lists_every_lending_setting_with_its_default() -> None:
    assert set(VALUES["lending"]) == LENDING_FIELDS
    for name, value in VALUES["lending"].items():
        assert as_setting(LendingSettings, name, value) == default_of(LendingSettings, name), name


def test_planner_and_executor_lend() -> None:
    # The template renders `lending` into these two by name.
    assert [service for service in SERVICES if BUILDER.lends(service)] == ["planner", "executor"]


def test_health_port_default_is_the_services_default() -> None:
    assert VALUES["healthPort"] == default_of(ServiceSettings, "health_port")


@pytest.mark.parametrize("service", SERVICES)
def test_service_config_lists_every_own_setting_with_its_default(service: str) -> None:
    model = settings_of(service)
    own_fields = set(model.model_fields) - set(ServiceSettings.model_fields) - LENDING_FIELDS
    documented = set(VALUES[service]["config"])
    assert documented - own_fields == set(), f"values.yaml {service}.config: unknown settings"
    assert own_fields - documented == set(), f"values.yaml {service}.config: undocumented"
    for name, value in VALUES[service]["config"].items():
        assert as_setting(model, name, value) == default_of(model, name), f"{service}.{name}"


@pytest.fixture(scope="module")
def default_deployments(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    objects = render(tmp_path_factory.mktemp("defaults"))
    return {component(d): d for d in by_kind(objects, "Deployment").values()}


@pytest.mark.parametrize("service", SERVICES)
def test_rendered_environment_parses_into_the_default_settings(
    service: str,
    default_deployments: dict[str, dict[str, Any]],
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    model = settings_of(service)
    env = container_env(default_deployments[service])
    literal = {
        name: value
        for name, value in env.items()
        if name.startswith("TIDESHIFT_") and isinstance(value, str)
    }
    for name in list(os.environ):
        if name.startswith("TIDESHIFT_"):
            monkeypatch.delenv(name)
    for name, value in literal.items():
        monkeypatch.setenv(name, value)
    settings = model()
    for name in model.model_fields:
        if name in BUILDER.CHART_MANAGED_SETTINGS - {"health_port"}:
            continue
        assert getattr(settings, name) == default_of(model, name), f"{service}.{name}"
    lent = {f"TIDESHIFT_{name.upper()}" for name in LENDING_FIELDS}
    assert lent <= set(literal) if BUILDER.lends(service) else not lent & set(literal)
    # Secrets and the pod name arrive through valueFrom, never as literal values.
    assert isinstance(env["TIDESHIFT_NATS_URL"], dict)
    assert isinstance(env["TIDESHIFT_INSTANCE"], dict)


def test_structured_settings_reach_the_services_as_json(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    planner_class = settings_of("planner")
    serving = {
        "namespace": "shop",
        "name": "web",
        "cpu": 0.5,
        "capacity_rps": 40,
        "max_replicas": 20,
    }
    training = {"namespace": "ml", "name": "ctr", "cpu": 4, "max_trainers": 16, "gang_min": 2}
    objects = render(
        tmp_path, {"planner": {"config": {"serving": [serving], "training": [training]}}}
    )
    planner = next(d for d in by_kind(objects, "Deployment").values() if component(d) == "planner")
    for name in list(os.environ):
        if name.startswith("TIDESHIFT_"):
            monkeypatch.delenv(name)
    for name, value in container_env(planner).items():
        if name.startswith("TIDESHIFT_") and isinstance(value, str):
            monkeypatch.setenv(name, value)
    settings: Any = planner_class()
    assert settings.serving[0].capacity_rps == 40
    assert settings.serving[0].max_replicas == 20
    assert settings.training[0].gang_min == 2
    assert settings.training[0].max_trainers == 16


def test_one_lending_margin_reaches_planner_and_executor(tmp_path: Path) -> None:
    objects = render(tmp_path, {"lending": {"lend_margin": 0.25}})
    for deployment in by_kind(objects, "Deployment").values():
        env = container_env(deployment)
        if BUILDER.lends(component(deployment)):
            assert env["TIDESHIFT_LEND_MARGIN"] == "0.25", component(deployment)
        else:
            assert "TIDESHIFT_LEND_MARGIN" not in env, component(deployment)
