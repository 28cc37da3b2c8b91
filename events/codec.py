"""CloudEvents 1.0 structured JSON mode: the only wire format of Tideshift events.

Structured mode puts every attribute in the body, so MQTT clients (which have no headers)
read the same bytes as NATS clients. `decode` never trusts its input: anything that is not
a valid event of a known type and version raises `EventRejected` with a one-line reason, and
nothing else (not for deep nesting, huge numbers, NaN, invalid UTF-8 or duplicate keys).
"""

from __future__ import annotations

import json
import math
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Generic, TypeVar

from pydantic import ValidationError

from tideshift.events.models import EventData
from tideshift.events.subjects import ALL_SUBJECTS

T = TypeVar("T", bound=EventData)

SPEC_VERSION = "1.0"
CONTENT_TYPE = "application/json"
DEFAULT_MAX_BYTES = 1024 * 1024

# Every model a decoder accepts, by its versioned CloudEvents type: exactly the models the
# subjects carry (each subject binds one model, so a model cannot be on the bus unregistered).
EVENT_MODELS: dict[str, type[EventData]] = {
    subject.model.event_type(): subject.model for subject in ALL_SUBJECTS
}
_REQUIRED = ("specversion", "id", "source", "type", "data")
_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1
_INT64_DIGITS = len(str(_INT64_MAX))


class EventRejected(ValueError):
    """A received message is not an acceptable event; `kind` is a short machine label."""

    def __init__(self, kind: str, reason: str) -> None:
        super().__init__(reason)
        self.kind = kind
        self.reason = reason


@dataclass(frozen=True)
class Envelope(Generic[T]):
    """A decoded CloudEvent: its context attributes and its validated payload."""

    id: str
    source: str
    type: str
    time: datetime | None
    subject: str | None
    data: T

    def to_json(self) -> str:
        return json.dumps(_attributes(self.data, self.id, self.source, self.time, self.subject))


def _attributes(
    data: EventData, event_id: str, source: str, time: datetime | None, subject: str | None
) -> dict[str, Any]:
    attributes: dict[str, Any] = {
        "specversion": SPEC_VERSION,
        "id": event_id,
        "source": source,
        "type": data.event_type(),
        "datacontenttype": CONTENT_TYPE,
    }
    if time is not None:
        attributes["time"] = time.isoformat()
    if subject is not None:
        attributes["subject"] = subject
    # Optional fields travel only when the producer set them: a field added within v1 (with
    # its default) is then sent only once used, so a reader one release older, which refuses
    # fields it does not know, reads everything else a newer producer sends during a rollout.
    attributes["data"] = data.model_dump(mode="json", exclude_unset=True)
    return attributes


def encode(
    data: EventData,
    *,
    source: str,
    subject: str | None = None,
    event_id: str | None = None,
    time: datetime | None = None,
) -> bytes:
    """Serialise a payload as a structured-mode CloudEvent (UTF-8 JSON)."""
    attributes = _attributes(
        data, event_id or str(uuid.uuid4()), source, time or datetime.now(UTC), subject
    )
    return json.dumps(attributes, separators=(",", ":")).encode("utf-8")


def decode(
    raw: bytes,
    expected: type[T] | None = None,
    *,
    max_bytes: int = DEFAULT_MAX_BYTES,
) -> Envelope[T]:
    """Parse and validate one CloudEvent; `expected` restricts it to one model."""
    if len(raw) > max_bytes:
        raise EventRejected("too_large", f"message of {len(raw)} bytes exceeds limit {max_bytes}")
    body = _parse_json(raw)
    if not isinstance(body, dict):
        raise EventRejected("not_cloudevent", "not a CloudEvent: JSON body is not an object")
    missing = [name for name in _REQUIRED if name not in body]
    if missing:
        raise EventRejected("not_cloudevent", f"not a CloudEvent: missing {', '.join(missing)}")
    if body["specversion"] != SPEC_VERSION:
        raise EventRejected(
            "not_cloudevent", f"unsupported specversion {body['specversion']!r}, expected 1.0"
        )
    event_type = body["type"]
    model = EVENT_MODELS.get(event_type) if isinstance(event_type, str) else None
    if model is None:
        raise EventRejected("unknown_type", _unknown_type_reason(event_type))
    if expected is not None and model is not expected:
        raise EventRejected(
            "unexpected_type", f"type {event_type} where {expected.event_type()} was expected"
        )
    for attribute in ("id", "source"):
        if not isinstance(body[attribute], str) or not body[attribute]:
            raise EventRejected(
                "not_cloudevent", f"CloudEvent {attribute} must be a non-empty string"
            )
    try:
        data = model.model_validate(body["data"])
    except ValidationError as error:
        first = error.errors()[0]
        where = ".".join(str(part) for part in first["loc"]) or "data"
        raise EventRejected(
            "invalid", f"{event_type} failed validation at data.{where}: {first['msg']}"
        ) from None
    except RecursionError:
        raise EventRejected("too_deep", f"{event_type} data is nested too deeply") from None
    return Envelope(
        id=body["id"],
        source=body["source"],
        type=event_type,
        time=_parse_time(body.get("time")),
        subject=body.get("subject") if isinstance(body.get("subject"), str) else None,
        data=data,  # type: ignore[arg-type]  # model is `expected` when one was given
    )


def _parse_json(raw: bytes) -> Any:
    """Strict JSON in UTF-8: no NaN/Infinity, no duplicate keys, no number beyond int64/float."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as error:
        reason = f"not UTF-8: {error.reason} at byte {error.start}"
        raise EventRejected("not_utf8", reason) from None
    try:
        return json.loads(
            text,
            object_pairs_hook=_object_without_duplicates,
            parse_int=_bounded_int,
            parse_float=_finite_float,
            parse_constant=_no_constant,
        )
    except EventRejected:
        raise
    except RecursionError:
        raise EventRejected("too_deep", "JSON nested too deeply") from None
    except ValueError as error:  # JSONDecodeError is a ValueError
        raise EventRejected("not_json", f"not JSON: {error}") from None


def _object_without_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    body: dict[str, Any] = {}
    for key, value in pairs:
        if key in body:
            raise EventRejected("not_json", f"duplicate JSON key {key[:64]!r}")
        body[key] = value
    return body


def _bounded_int(literal: str) -> int:
    # The digits are counted before int() so a 100,000-digit literal costs nothing.
    value = int(literal) if len(literal.lstrip("-")) <= _INT64_DIGITS else None
    if value is None or not _INT64_MIN <= value <= _INT64_MAX:
        raise EventRejected("out_of_range", f"integer {literal[:24]} is beyond 64 bits")
    return value


def _finite_float(literal: str) -> float:
    value = float(literal)
    if not math.isfinite(value):
        raise EventRejected("out_of_range", f"number {literal[:24]} is beyond a 64-bit float")
    return value


def _no_constant(name: str) -> float:
    raise EventRejected("not_json", f"{name} is not a JSON number (only finite numbers are)")


def _unknown_type_reason(event_type: object) -> str:
    if not isinstance(event_type, str):
        return f"CloudEvent type must be a string, got {type(event_type).__name__}"
    base, _, version = event_type.rpartition(".v")
    known = {name.rpartition(".v")[0]: name for name in EVENT_MODELS}
    if base in known:
        return f"unsupported schema version v{version} of {base}; this build reads {known[base]}"
    return f"unknown event type {event_type!r}"


def _parse_time(value: object) -> datetime | None:
    if not isinstance(value, str):
        return None
    try:
        return datetime.fromisoformat(value)
    except ValueError:
        raise EventRejected("not_cloudevent", f"time {value!r} is not RFC 3339") from None
