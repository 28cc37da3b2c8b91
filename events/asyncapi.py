"""The AsyncAPI 3.0 document of the contract: one channel per subject, with payload schemas."""

from __future__ import annotations

from typing import Any

from tideshift.events.codec import CONTENT_TYPE, SPEC_VERSION
from tideshift.events.subjects import ALL_SUBJECTS, Subject, mqtt_topic_filter


def _channel_name(subject: Subject[Any]) -> str:
    name: str = subject.model.event_name
    return name.replace(".", "_")


def _envelope_schema(subject: Subject[Any], defs: dict[str, Any]) -> dict[str, Any]:
    payload = subject.model.model_json_schema(ref_template="#/components/schemas/{model}")
    defs.update(payload.pop("$defs", {}))
    return {
        "type": "object",
        "description": "CloudEvents 1.0, structured JSON mode",
        "required": ["specversion", "id", "source", "type", "data"],
        "properties": {
            "specversion": {"const": SPEC_VERSION},
            "id": {"type": "string"},
            "source": {"type": "string"},
            "type": {"const": subject.model.event_type()},
            "time": {"type": "string", "format": "date-time"},
            "subject": {"type": "string"},
            "datacontenttype": {"const": CONTENT_TYPE},
            "data": payload,
        },
    }


def asyncapi_document() -> dict[str, Any]:
    defs: dict[str, Any] = {}
    channels: dict[str, Any] = {}
    operations: dict[str, Any] = {}
    for subject in ALL_SUBJECTS:
        name = _channel_name(subject)
        address = subject.pattern
        channels[name] = {
            "address": address,
            "description": subject.description,
            "parameters": {
                param: {"description": "subject token, escaped with events.tokens.encode_token"}
                for param in subject.params
            },
            "messages": {
                name: {
                    "name": subject.model.event_type(),
                    "contentType": CONTENT_TYPE,
                    "payload": _envelope_schema(subject, defs),
                }
            },
            "x-mqtt-topic": mqtt_topic_filter(address),
            "x-jetstream": subject.durable,
        }
        operations[f"receive_{name}"] = {
            "action": "receive",
            "channel": {"$ref": f"#/channels/{name}"},
        }
    return {
        "asyncapi": "3.0.0",
        "info": {
            "title": "Tideshift events",
            "version": "1.0.0",
            "description": "Every event Tideshift publishes; reachable over NATS and MQTT.",
        },
        "defaultContentType": CONTENT_TYPE,
        "channels": channels,
        "operations": operations,
        "components": {"schemas": defs},
    }
