"""Reversible encoding of arbitrary strings (Kubernetes names) into single subject tokens.

NATS splits subjects on `.`, treats `*` and `>` as wildcards and forbids whitespace; MQTT
splits on `/` and treats `+` and `#` as wildcards. Kubernetes object names may contain dots
(`web.v2`), so a name cannot be used as a token as it is. Every character outside
`[A-Za-z0-9-]` is written as `_` followed by two upper-case hex digits per UTF-8 byte, so
`web.v2` becomes `web_2Ev2` and the mapping is a bijection on all strings. The empty string
is spelled `_` (a bare underscore is never produced otherwise).
"""

from __future__ import annotations

import re

_PLAIN = re.compile(r"[A-Za-z0-9-]")
_ESCAPE = re.compile(r"_([0-9A-F]{2})")
_VALID_TOKEN = re.compile(r"(?:[A-Za-z0-9-]|_[0-9A-F]{2})+")
EMPTY_TOKEN = "_"


def encode_token(value: str) -> str:
    """Encode one string as one NATS/MQTT-safe subject token."""
    if value == "":
        return EMPTY_TOKEN
    parts: list[str] = []
    for char in value:
        if _PLAIN.fullmatch(char):
            parts.append(char)
        else:
            parts.extend(f"_{byte:02X}" for byte in char.encode("utf-8"))
    return "".join(parts)


def decode_token(token: str) -> str:
    """Invert `encode_token`; raises ValueError on a token it could not have produced."""
    if token == EMPTY_TOKEN:
        return ""
    if not _VALID_TOKEN.fullmatch(token):
        raise ValueError(f"not an encoded subject token: {token!r}")
    raw = bytearray()
    position = 0
    while position < len(token):
        if token[position] == "_":
            raw.append(int(token[position + 1 : position + 3], 16))
            position += 3
        else:
            raw.extend(token[position].encode("ascii"))
            position += 1
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as error:
        raise ValueError(f"token {token!r} does not decode to UTF-8") from error
