"""Binary payloads of the parameter server: a JSON header plus raw little-endian arrays.

Parameters and gradients are many thousands of floats per message; JSON numbers would be ~3x the
size and lossy to round-trip, so they travel as raw bytes next to a small JSON header.
Layout: 4-byte big-endian header length, UTF-8 JSON header, then the arrays back to back.
The header lists each array's name, dtype and shape; `unpack` checks every byte is
accounted for and raises WireError naming what is wrong. Pure: no I/O.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Mapping
from typing import Any

import numpy as np
import numpy.typing as npt

_LENGTH = struct.Struct(">I")
_ALLOWED_DTYPES: dict[str, np.dtype[Any]] = {
    "<f4": np.dtype("<f4"),
    "<f8": np.dtype("<f8"),
    "<i8": np.dtype("<i8"),
}
MAX_HEADER_BYTES = 64 * 1024


class WireError(ValueError):
    """A payload that cannot be decoded; the message says which part is wrong."""


def pack(header: Mapping[str, Any], arrays: Mapping[str, npt.NDArray[Any]] | None = None) -> bytes:
    """Encode ``header`` (JSON-serialisable) and ``arrays`` (float32 stays float32, other
    floats travel as float64, anything else as int64)."""
    layout: list[dict[str, Any]] = []
    blobs: list[bytes] = []
    for name, array in (arrays or {}).items():
        if array.dtype == np.float32:
            kind = "<f4"
        else:
            kind = "<f8" if np.issubdtype(array.dtype, np.floating) else "<i8"
        data = np.ascontiguousarray(array, dtype=_ALLOWED_DTYPES[kind])
        layout.append({"name": name, "dtype": kind, "shape": list(data.shape)})
        blobs.append(data.tobytes())
    head = json.dumps({"header": dict(header), "arrays": layout}, separators=(",", ":")).encode()
    return _LENGTH.pack(len(head)) + head + b"".join(blobs)


def unpack(payload: bytes) -> tuple[dict[str, Any], dict[str, npt.NDArray[Any]]]:
    """Decode a payload made by `pack`; raises WireError on anything malformed."""
    if len(payload) < _LENGTH.size:
        raise WireError(f"payload of {len(payload)} bytes is shorter than its length prefix")
    (head_length,) = _LENGTH.unpack_from(payload)
    if head_length > MAX_HEADER_BYTES or _LENGTH.size + head_length > len(payload):
        raise WireError(f"header length {head_length} does not fit a {len(payload)}-byte payload")
    try:
        head = json.loads(payload[_LENGTH.size : _LENGTH.size + head_length])
    # ValueError covers invalid UTF-8, invalid JSON and integers beyond the digit limit;
    # nesting deeper than the interpreter's recursion limit raises RecursionError.
    except (ValueError, RecursionError) as error:
        raise WireError(f"header is not JSON: {type(error).__name__}: {error}") from error
    if not isinstance(head, dict) or not isinstance(head.get("header"), dict):
        raise WireError("header: expected an object with a 'header' object")
    layout = head.get("arrays", [])
    if not isinstance(layout, list):
        raise WireError("header: 'arrays' must be a list")
    arrays: dict[str, npt.NDArray[Any]] = {}
    offset = _LENGTH.size + head_length
    for entry in layout:
        name, dtype, shape = _array_entry(entry)
        count = int(np.prod(shape, dtype=np.int64)) if shape else 1
        size = count * dtype.itemsize
        if offset + size > len(payload):
            raise WireError(f"array {name!r}: {size} bytes announced, payload too short")
        arrays[name] = np.frombuffer(payload, dtype=dtype, count=count, offset=offset).reshape(
            shape
        )
        offset += size
    if offset != len(payload):
        raise WireError(f"{len(payload) - offset} trailing bytes after the last array")
    return head["header"], arrays


def _array_entry(entry: Any) -> tuple[str, np.dtype[Any], tuple[int, ...]]:
    if not isinstance(entry, dict):
        raise WireError("arrays: each entry must be an object")
    name, dtype, shape = entry.get("name"), entry.get("dtype"), entry.get("shape")
    if not isinstance(name, str):
        raise WireError("arrays: entry without a string 'name'")
    if dtype not in _ALLOWED_DTYPES:
        raise WireError(f"array {name!r}: dtype must be one of {sorted(_ALLOWED_DTYPES)}")
    if not isinstance(shape, list) or not all(
        isinstance(d, int) and not isinstance(d, bool) and 0 <= d < 2**31 for d in shape
    ):
        raise WireError(f"array {name!r}: shape must be a list of non-negative integers")
    return name, _ALLOWED_DTYPES[dtype], tuple(shape)


def header_int(header: Mapping[str, Any], name: str, *, minimum: int | None = None) -> int:
    """An integer header field, or WireError naming it."""
    value = header.get(name)
    if not isinstance(value, int) or isinstance(value, bool):
        raise WireError(f"field {name!r}: expected an integer, got {value!r}")
    if minimum is not None and value < minimum:
        raise WireError(f"field {name!r}: expected >= {minimum}, got {value}")
    return value


def header_str(header: Mapping[str, Any], name: str) -> str:
    value = header.get(name)
    if not isinstance(value, str) or not value:
        raise WireError(f"field {name!r}: expected a non-empty string, got {value!r}")
    return value
