"""Service settings: one pydantic-settings class per service, parsed by pydantic-settings' CLI.

Every field is settable by a flag (`--nats-url`) or an environment variable with the
`TIDESHIFT_` prefix (`TIDESHIFT_NATS_URL`); flags win. Lists and mappings are given as JSON;
booleans are plain flags (`--dry-run`, `--no-dry-run`). `parse_settings` turns a validation
failure into one line naming the flag, the environment variable and what was expected, which is
what `tideshift run <service>` prints before exiting 2. Imports no service.
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, ClassVar, NoReturn, TypeVar

from pydantic import Field, SecretStr, ValidationError, model_validator
from pydantic.fields import FieldInfo
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    SettingsError,
)

S = TypeVar("S", bound="ServiceSettings")
ENV_PREFIX = "TIDESHIFT_"


class _RenamedEnv(PydanticBaseSettingsSource):
    """Environment variables of renamed settings, under their old names (below the new names,
    flags and keyword arguments, which take the old names as aliases)."""

    def get_field_value(self, field: FieldInfo, field_name: str) -> tuple[Any, str, bool]:
        return None, field_name, False

    def __call__(self) -> dict[str, Any]:
        renamed: dict[str, str] = getattr(self.settings_cls, "renamed", {})
        values: dict[str, Any] = {}
        for old, new in renamed.items():
            raw = os.environ.get(f"{ENV_PREFIX}{old.upper()}")
            if raw is not None:
                values.setdefault(new, raw)
        return values


class ServiceSettings(BaseSettings):
    """Settings every service shares."""

    model_config = SettingsConfigDict(
        env_prefix=ENV_PREFIX,
        extra="forbid",
        frozen=True,
        # How pydantic-settings' CLI source renders the fields when `parse_settings` parses argv
        # (constructing a settings object directly reads no argv).
        cli_kebab_case=True,
        cli_implicit_flags=True,
        cli_hide_none_type=True,
        cli_show_env_vars=True,
    )
    # Old name -> new name of each setting renamed; the old flag (`parse_settings`), keyword
    # and environment variable still set the new one, and the new name wins over the old.
    renamed: ClassVar[dict[str, str]] = {}

    def __init__(self, **values: Any) -> None:
        argv = values.get("_cli_parse_args")
        if isinstance(argv, list | tuple):
            values["_cli_parse_args"] = _renamed_flags(type(self), argv)
        super().__init__(**values)

    @model_validator(mode="before")
    @classmethod
    def _old_names(cls, values: Any) -> Any:
        if not isinstance(values, dict) or not cls.renamed:
            return values
        values = dict(values)
        for old, new in cls.renamed.items():
            if old in values:
                values.setdefault(new, values.pop(old))
        return values

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        return (
            init_settings,
            env_settings,
            dotenv_settings,
            file_secret_settings,
            _RenamedEnv(settings_cls),
        )

    nats_url: str | None = Field(
        default=None,
        description=(
            "NATS server URL, or a cluster's several comma-separated; unset = start the "
            "bundled nats-server (embedded default)"
        ),
    )
    nats_replicas: int = Field(
        default=1,
        ge=1,
        le=5,
        description="servers of a NATS cluster that keep each stream and bucket (3 in a cluster)",
    )
    nats_credentials: str | None = Field(
        default=None, description="path to a NATS .creds file (from a Secret in Kubernetes)"
    )
    nats_user: str | None = Field(
        default=None,
        description="NATS user of this service's role (watcher, planner, ...; the Bus identities "
        "reference page lists them)",
    )
    nats_password: SecretStr | None = Field(
        default=None, description="its password (prefer --nats-password-file)"
    )
    nats_password_file: Path | None = Field(
        default=None, description="file holding the password (a mounted Secret in Kubernetes)"
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

    def nats_secret(self) -> str | None:
        """The NATS password, from the setting or read from its file (stripped of the newline
        a Secret file often ends with)."""
        if self.nats_password is not None and self.nats_password_file is not None:
            raise ValueError("give --nats-password or --nats-password-file, not both")
        if self.nats_password is not None:
            return self.nats_password.get_secret_value()
        if self.nats_password_file is None:
            return None
        try:
            return self.nats_password_file.read_text().strip()
        except (OSError, UnicodeDecodeError) as error:
            raise ValueError(
                f"--nats-password-file {self.nats_password_file}: cannot read it ({error})"
            ) from None


def _flag(field: str) -> str:
    return "--" + field.replace("_", "-")


def _exit_invalid(
    prog: str,
    settings_class: type[ServiceSettings],
    field: str,
    reason: str,
    *,
    where: str = "",
) -> NoReturn:
    old = [_flag(name) for name, new in settings_class.renamed.items() if new == field]
    print(
        f"{prog}: invalid {_flag(field)} (env {ENV_PREFIX}{field.upper()}"
        f"{'; old names ' + ', '.join(old) if old else ''})"
        f"{' at ' + where if where else ''}: {reason}",
        file=sys.stderr,
    )
    raise SystemExit(2) from None


def _field_named_in(message: str, settings_class: type[ServiceSettings]) -> str | None:
    """The setting a pydantic-settings parse error names (it quotes it in several styles)."""
    words: list[str] = re.findall(r"[a-z][a-z0-9_]*", message)
    return next((word for word in words if word in settings_class.model_fields), None)


def _renamed_flags(settings_class: type[ServiceSettings], argv: Sequence[str]) -> list[str]:
    """`argv` with each renamed setting's old flag (`--old-name`, `--old-name=...`) spelt new."""
    flags = {_flag(old): _flag(new) for old, new in settings_class.renamed.items()}
    spelt = []
    for word in argv:
        flag, equals, value = word.partition("=")
        spelt.append(flags[flag] + equals + value if flag in flags else word)
    return spelt


def parse_settings(settings_class: type[S], argv: Sequence[str], *, prog: str) -> S:
    """Flags over environment over defaults; exits 2 with a one-line reason when invalid.

    `--help` prints every setting with its description, default and environment variable.
    """
    try:
        return settings_class(_cli_parse_args=list(argv), _cli_prog_name=prog)
    except ValidationError as error:
        first = error.errors()[0]
        field = str(first["loc"][0]) if first["loc"] else "?"
        where = ".".join(str(part) for part in first["loc"][1:])
        _exit_invalid(prog, settings_class, field, first["msg"], where=where)
    except SettingsError as error:
        # Malformed JSON in a list or mapping setting, from a flag or the environment.
        reason = str(error.__cause__ or error)
        named = _field_named_in(str(error), settings_class)
        if named is None:
            print(f"{prog}: {reason}", file=sys.stderr)
            raise SystemExit(2) from None
        _exit_invalid(prog, settings_class, named, f"expected JSON ({reason})")


# What a node never lends to batch trainers, as a fraction of its allocatable: the default
# of `cluster.core.overcommit.OvercommitConfig.margin` (a test keeps the two equal).
DEFAULT_LEND_MARGIN = 0.1


class LendingSettings(ServiceSettings):
    """The lending section, one declaration for the planner (what it plans to lend) and the
    executor (what it advertises on each Node): set once, both agree."""

    renamed: ClassVar[dict[str, str]] = {
        "overcommit_margin": "lend_margin",
        "batch_margin": "lend_margin",
    }

    lend_margin: float = Field(
        default=DEFAULT_LEND_MARGIN,
        ge=0.0,
        lt=1.0,
        description="fraction of each node's allocatable never lent to batch trainers: the "
        "planner plans with it and the executor advertises with it (was the planner's "
        "overcommit_margin and the executor's batch_margin, still accepted)",
    )
