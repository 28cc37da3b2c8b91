"""CloudEvents 1.0 structured JSON mode: the only wire format of Tideshift events.

Structured mode puts every attribute in the body, so MQTT clients (which have no headers)
read the same bytes as NATS clients. `decode` never trusts its input: anything that is not
a valid event of a known type and version raises `EventRejected` with a one-line reason.
"""

from __future__ import annotations

import json
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
    attributes["data"] = data.model_dump(mode="json")
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
    try:
        body = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise EventRejected("not_json", f"not JSON: {error}") from None
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
    try:
        data = model.model_validate(body["data"])
    except ValidationError as error:
        first = error.errors()[0]
        where = ".".join(str(part) for part in first["loc"]) or "data"
        raise EventRejected(
            "invalid", f"{event_type} failed validation at data.{where}: {first['msg']}"
        ) from None
    return Envelope(
        id=str(body["id"]),
        source=str(body["source"]),
        type=event_type,
        time=_parse_time(body.get("time")),
        subject=body.get("subject") if isinstance(body.get("subject"), str) else None,
        data=data,  # type: ignore[arg-type]  # model is `expected` when one was given
    )


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
