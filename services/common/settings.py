"""Service settings: one pydantic-settings class per service, mapped onto CLI flags.

Every field is settable by a flag (`--nats-url`) or an environment variable with the
`TIDESHIFT_` prefix (`TIDESHIFT_NATS_URL`); flags win. Lists and mappings are given as JSON.
`parse_settings` turns a validation failure into one line naming the flag and what was
expected, which is what `tideshift run <service>` prints before exiting 2.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from typing import Any, TypeVar, get_origin

from pydantic import Field, ValidationError
from pydantic_settings import BaseSettings, SettingsConfigDict

S = TypeVar("S", bound="ServiceSettings")


class ServiceSettings(BaseSettings):
    """Settings every service shares."""

    model_config = SettingsConfigDict(env_prefix="TIDESHIFT_", extra="forbid", frozen=True)

    nats_url: str | None = Field(
        default=None,
        description="NATS server URL; unset = start the bundled nats-server (embedded default)",
    )
    nats_credentials: str | None = Field(
        default=None, description="path to a NATS .creds file (from a Secret in Kubernetes)"
    )
    instance: str = Field(default="", description="this replica's name; default host-pid")
    health_host: str = Field(default="0.0.0.0", description="address of /healthz and /metrics")
    health_port: int = Field(
        default=8080,
        ge=-1,
        le=65535,
        description="port of /healthz, /readyz, /metrics; 0 = any, -1 = off",
    )
    log_level: str = Field(default="INFO", pattern="^(DEBUG|INFO|WARNING|ERROR)$")
    max_message_bytes: int = Field(
        default=1024 * 1024, gt=0, description="events larger than this are dead-lettered"
    )


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def _is_structured(annotation: Any) -> bool:
    origin = get_origin(annotation)
    return origin in (list, dict, tuple, set) or (
        isinstance(annotation, type) and hasattr(annotation, "model_fields")
    )


def build_parser(settings_class: type[ServiceSettings], prog: str) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=prog,
        description=(settings_class.__doc__ or "").strip(),
        epilog="Every option can also be set as TIDESHIFT_<OPTION> in the environment.",
    )
    for name, info in settings_class.model_fields.items():
        default = info.default if info.default_factory is None else info.default_factory()  # type: ignore[call-arg]
        shown = json.dumps(default) if _is_structured(info.annotation) else default
        parser.add_argument(
            _flag(name),
            dest=name,
            default=None,
            metavar="JSON" if _is_structured(info.annotation) else name.split("_")[-1].upper(),
            help=f"{info.description or ''} (default: {shown}; env TIDESHIFT_{name.upper()})",
        )
    return parser


def parse_settings(settings_class: type[S], argv: Sequence[str], *, prog: str) -> S:
    """Flags over environment over defaults; exits 2 with a one-line reason when invalid."""
    parser = build_parser(settings_class, prog)
    namespace = parser.parse_args(list(argv))
    overrides: dict[str, Any] = {}
    for name, info in settings_class.model_fields.items():
        raw = getattr(namespace, name)
        if raw is None:
            continue
        if _is_structured(info.annotation):
            try:
                overrides[name] = json.loads(raw)
            except json.JSONDecodeError as error:
                parser.error(f"{_flag(name)}: expected JSON ({error.msg} at column {error.colno})")
        else:
            overrides[name] = raw
    try:
        return settings_class(**overrides)
    except ValidationError as error:
        first = error.errors()[0]
        field = str(first["loc"][0]) if first["loc"] else "?"
        where = ".".join(str(part) for part in first["loc"][1:])
        print(
            f"{prog}: invalid {_flag(field)} (env TIDESHIFT_{field.upper()})"
            f"{' at ' + where if where else ''}: {first['msg']}",
            file=sys.stderr,
        )
        raise SystemExit(2) from None
