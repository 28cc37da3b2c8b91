"""A policy whose replica bounds are out of order says both values, so the wrong one is seen."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from tideshift.events.models import ServingPolicy, TrainingPolicy


def test_a_serving_policy_with_min_above_max_names_both_values() -> None:
    with pytest.raises(ValidationError, match="min-replicas 2147483647 above max-replicas 1000"):
        ServingPolicy(capacity_rps=10.0, min_replicas=2**31 - 1)


def test_a_training_policy_with_min_above_max_names_both_values() -> None:
    with pytest.raises(ValidationError, match="min-replicas 5 above max-replicas 3"):
        TrainingPolicy(min_replicas=5, max_replicas=3)


def test_ordered_bounds_are_accepted() -> None:
    assert ServingPolicy(capacity_rps=10.0, min_replicas=3, max_replicas=3).max_replicas == 3
