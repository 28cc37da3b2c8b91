"""A job's dataset: the list of shard locations its trainers read, one task per shard.

`--dataset` is a directory (its files, sorted), a glob (`/data/part-*.parquet`, sorted), a
single URI, or a JSON list of paths and URIs in the order given. The SDK passes each
location to the user's `read_shard`; Tideshift never opens the data itself.
"""

from __future__ import annotations

import glob
import json
from pathlib import Path

from tideshift.services.trainer.core.jobspec import MAX_SHARDS

_GLOB_CHARS = set("*?[")


def resolve_shards(dataset: str) -> tuple[str, ...]:
    """The shard locations `dataset` names; ValueError says what was expected."""
    text = dataset.strip()
    if not text:
        raise ValueError("dataset is empty: expected a directory, a glob, a URI or a JSON list")
    if text.startswith("["):
        try:
            locations = json.loads(text)
        except json.JSONDecodeError as error:
            raise ValueError(f"dataset: not a JSON list ({error.msg} at {error.pos})") from error
        if not isinstance(locations, list) or not all(
            isinstance(item, str) and item for item in locations
        ):
            raise ValueError("dataset: the JSON list must hold non-empty strings")
        found = [str(item) for item in locations]
    elif "://" in text:
        found = [text]
    elif Path(text).is_dir():
        found = sorted(
            str(path)
            for path in Path(text).iterdir()
            if path.is_file() and not path.name.startswith(".")
        )
    elif _GLOB_CHARS & set(text):
        found = sorted(path for path in glob.glob(text) if Path(path).is_file())
    elif Path(text).is_file():
        found = [text]
    else:
        raise ValueError(f"dataset {text!r}: no such directory or file, and not a glob or URI")
    if not found:
        raise ValueError(f"dataset {text!r}: no shard found")
    if len(found) > MAX_SHARDS:
        raise ValueError(f"dataset {text!r}: {len(found)} shards, at most {MAX_SHARDS}")
    return tuple(found)
