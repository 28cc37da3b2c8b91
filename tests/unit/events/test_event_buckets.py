"""Every bucket name is defined once, in `tideshift.events.buckets`, and is a valid NATS name."""

from __future__ import annotations

import re
from pathlib import Path

import tideshift.events as events
from tideshift.events import buckets

REPO = Path(__file__).resolve().parents[3]
# NATS bucket names: letters, digits, dashes and underscores only.
VALID = re.compile(r"^[A-Za-z0-9_-]+$")


def test_bucket_names_are_valid_and_distinct() -> None:
    assert all(VALID.match(name) for name in buckets.ALL_BUCKETS)
    assert len(set(buckets.ALL_BUCKETS)) == len(buckets.ALL_BUCKETS)


def test_every_bucket_constant_is_listed_and_exported() -> None:
    constants = {name: value for name, value in vars(buckets).items() if name.endswith("_BUCKET")}
    assert sorted(constants.values()) == sorted(buckets.ALL_BUCKETS)
    assert all(getattr(events, name) == value for name, value in constants.items())


def test_no_other_module_spells_a_bucket_name() -> None:
    spelled = [
        f"{path.relative_to(REPO)}: {name}"
        for folder in ("events", "services", "loadgen")
        for path in sorted((REPO / folder).rglob("*.py"))
        if path != REPO / "events" / "buckets.py"
        for name in buckets.ALL_BUCKETS
        if f'"{name}"' in path.read_text(encoding="utf-8")
    ]
    assert spelled == []
