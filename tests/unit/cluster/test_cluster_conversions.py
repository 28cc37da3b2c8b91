"""The pure conversions' own quantity parser reads what the apiserver writes, as the official
client's `parse_quantity` did. Object conversions: test_watcher_conversion.py."""

from __future__ import annotations

from decimal import Decimal

import pytest

from tideshift.services.cluster.core.conversions import parse_quantity, resources_of, same_content
from tideshift.services.cluster.port import Node, Resources


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("1.5", Decimal("1.5")),
        ("250m", Decimal("0.25")),
        ("1e3", Decimal("1000")),
        ("2k", Decimal("2000")),
        ("100Ki", Decimal(102400)),
        ("32Gi", Decimal(32 * 1024**3)),
        ("3M", Decimal(3_000_000)),
        ("1Ei", Decimal(1024**6)),
        ("7n", Decimal("7e-9")),
    ],
)
def test_quantities_in_kubernetes_notation(text: str, expected: Decimal) -> None:
    assert parse_quantity(text) == expected


@pytest.mark.parametrize("text", ["", "x", "1ki", "1mi", "1Xi", "1.2.3"])
def test_unreadable_quantities_are_value_errors(text: str) -> None:
    with pytest.raises(ValueError):
        parse_quantity(text)


def test_resources_in_plain_units() -> None:
    amounts = {"cpu": "500m", "memory": "1Gi", "nvidia.com/gpu": 2}
    assert resources_of(amounts) == Resources(cpu=0.5, memory=1024.0**3, gpu=2)
    assert resources_of(None) == Resources()


def test_a_new_resource_version_alone_is_no_change() -> None:
    before = Node("a", Resources(cpu=4), resource_version="1")
    assert same_content(before, Node("a", Resources(cpu=4), resource_version="2"))
    assert not same_content(before, Node("a", Resources(cpu=8), resource_version="2"))
