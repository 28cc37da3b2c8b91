"""During a rolling upgrade a reader one release older meets a newer producer. It refuses a
field it does not know (every model forbids extras), so an optional field added within v1 is
sent only when the producer set it: a newer producer's events stay readable until it uses
the new field (docs/operations/reliability-table.md, the contract's versions)."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pytest
from pydantic import ConfigDict, ValidationError, create_model

from tests.fixtures.support import forecast
from tideshift import events

NOW = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)


# ForecastIssued as the release before forecast honesty read it: the same fields less the two
# it did not have, refusing extras as every model does.
OlderForecast = create_model(
    "OlderForecast",
    __config__=ConfigDict(frozen=True, extra="forbid"),
    **{
        name: (field.annotation, field)
        for name, field in events.ForecastIssued.model_fields.items()
        if name not in {"coverage", "untrusted_reason"}
    },  # type: ignore[call-overload]
)


def sent(event: events.EventData) -> dict[str, object]:
    document = json.loads(events.encode(event, source="test"))
    data = document["data"]
    assert isinstance(data, dict)
    return data


def test_unset_optional_fields_are_not_sent_and_read_back_as_their_defaults() -> None:
    plain = forecast("shop", "web", [10.0, 20.0], issued_at=NOW)
    data = sent(plain)
    assert "coverage" not in data and "untrusted_reason" not in data and "stale" not in data
    back = events.decode(events.encode(plain, source="test"), events.ForecastIssued).data
    assert back == plain and back.coverage is None and back.untrusted_reason == ""


def test_an_older_reader_reads_a_newer_event_until_the_new_field_is_used() -> None:
    plain = forecast("shop", "web", [10.0], issued_at=NOW)
    assert OlderForecast.model_validate(sent(plain)).points == plain.points
    used = plain.model_copy(update={"coverage": 0.93})
    assert sent(used)["coverage"] == 0.93
    with pytest.raises(ValidationError, match="coverage"):
        OlderForecast.model_validate(sent(used))


def test_a_field_set_to_its_default_is_still_sent() -> None:
    explicit = forecast("shop", "web", [10.0], issued_at=NOW).model_copy(update={"stale": False})
    assert sent(explicit)["stale"] is False
