"""Hostile payloads: `decode` answers each with a rejection and a reason, never a crash."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tideshift import events

NOW = datetime(2026, 1, 1, tzinfo=UTC)
RESULT = events.ScaleResult(
    target=events.WorkloadRef(kind="Deployment", namespace="shop", name="web"),
    idempotency_key="k1",
    outcome="applied",
    previous=1,
    current=3,
    desired=3,
    executed_at=NOW,
)


def _result_with(**data: object) -> bytes:
    body = json.loads(events.encode(RESULT, source="t"))
    body["data"].update(data)
    return json.dumps(body, allow_nan=True).encode()


def _valid_text() -> str:
    return events.encode(RESULT, source="t").decode()


HOSTILE = {
    "deep array": (b"[" * 100_000, "too_deep", "nested too deeply"),
    "deep object": (b'{"a":' * 100_000, "too_deep", "nested too deeply"),
    "deep data": (
        _valid_text().replace('"outcome":"applied"', '"outcome":' + "[" * 5000).encode(),
        "too_deep",
        "nested too deeply",
    ),
    "huge integer": (
        _result_with(desired=0).replace(b'"desired": 0', b'"desired": ' + b"9" * 100_000),
        "out_of_range",
        "beyond 64 bits",
    ),
    "int beyond int64": (
        _result_with(desired=0).replace(b'"desired": 0', b'"desired": 9223372036854775808'),
        "out_of_range",
        "beyond 64 bits",
    ),
    "float overflow": (
        _result_with(desired=0).replace(b'"desired": 0', b'"desired": 1e400'),
        "out_of_range",
        "beyond a 64-bit float",
    ),
    "NaN literal": (_result_with(current=float("nan")), "not_json", "NaN is not a JSON number"),
    "Infinity literal": (
        _result_with(current=float("inf")),
        "not_json",
        "Infinity is not a JSON number",
    ),
    "negative count": (_result_with(current=-1), "invalid", "data.current"),
    "wrong type": (_result_with(desired="three"), "invalid", "data.desired"),
    "id not a string": (
        _valid_text()
        .replace('"id":"', '"id":["', 1)
        .replace('","source"', '"],"source"', 1)
        .encode(),
        "not_cloudevent",
        "id must be a non-empty string",
    ),
    "invalid UTF-8": (b'{"id": "\xc3\x28"}', "not_utf8", "not UTF-8"),
    "UTF-16": ('{"id": "1"}'.encode("utf-16"), "not_utf8", "not UTF-8"),
    "duplicate key": (
        _valid_text()
        .replace('"outcome":"applied"', '"outcome":"applied","outcome":"noop"')
        .encode(),
        "not_json",
        "duplicate JSON key 'outcome'",
    ),
    "oversized": (b" " * 2_000_000, "too_large", "exceeds limit"),
}


@pytest.mark.parametrize("name", list(HOSTILE))
def test_hostile_payloads_are_rejected_with_a_reason(name: str) -> None:
    raw, kind, fragment = HOSTILE[name]
    with pytest.raises(events.EventRejected) as caught:
        events.decode(raw)
    assert caught.value.kind == kind
    assert fragment in caught.value.reason
    assert "\n" not in caught.value.reason, "the reason is one line"


def test_non_finite_floats_are_refused_by_the_contract_itself() -> None:
    with pytest.raises(ValueError, match="finite"):
        events.Resources(cpu=float("inf"))
    with pytest.raises(ValueError, match="finite"):
        events.ForecastPoint(at=NOW, point=float("nan"), q50=1, q90=1, q95=1, q99=1)


def test_a_valid_event_still_decodes() -> None:
    assert events.decode(events.encode(RESULT, source="t")).data == RESULT


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=512))
def test_arbitrary_bytes_only_ever_raise_a_rejection(raw: bytes) -> None:
    with pytest.raises(events.EventRejected):
        events.decode(raw)


@settings(max_examples=200, deadline=None)
@given(
    st.recursive(
        st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
        lambda children: (
            st.lists(children, max_size=4)
            | st.dictionaries(st.text(max_size=10), children, max_size=4)
        ),
        max_leaves=30,
    )
)
def test_any_json_in_place_of_the_data_is_rejected(data: object) -> None:
    body = json.loads(events.encode(RESULT, source="t"))
    body["data"] = data
    raw = json.dumps(body, allow_nan=True).encode()
    with pytest.raises(events.EventRejected):
        events.decode(raw)
