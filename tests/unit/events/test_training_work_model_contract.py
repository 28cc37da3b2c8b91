"""The TrainingPolicy event's work model (restart_cost_seconds, speedup_exponent): optional
(an event from before them reads as the planner's defaults), bounded, the field named in the
error."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from tideshift import events
from tideshift.events.asyncapi import asyncapi_document


def test_an_event_without_the_work_model_reads_as_not_said() -> None:
    policy = events.TrainingPolicy.model_validate({"gang_min": 2})
    assert policy.restart_cost_seconds is None and policy.speedup_exponent is None
    schema = asyncapi_document()["components"]["schemas"]["TrainingPolicy"]
    assert "restart_cost_seconds" in schema["properties"]
    assert "speedup_exponent" not in schema.get("required", [])


def test_the_work_model_round_trips() -> None:
    policy = events.TrainingPolicy(restart_cost_seconds=90.0, speedup_exponent=0.7)
    assert events.TrainingPolicy.model_validate_json(policy.model_dump_json()) == policy


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("restart_cost_seconds", -1.0),
        ("restart_cost_seconds", 3601.0),
        ("restart_cost_seconds", float("nan")),
        ("speedup_exponent", 0.0),
        ("speedup_exponent", 1.01),
    ],
)
def test_out_of_bounds_values_are_refused_naming_the_field(field: str, value: float) -> None:
    with pytest.raises(ValidationError) as caught:
        events.TrainingPolicy.model_validate({field: value})
    assert caught.value.errors()[0]["loc"] == (field,)
