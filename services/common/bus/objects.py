"""NATS object store: whole objects (checkpoints) by name in a bucket."""

from __future__ import annotations

import nats.js.errors
from nats.js import JetStreamContext
from nats.js.object_store import ObjectStore


async def object_store(js: JetStreamContext, bucket: str) -> ObjectStore:
    """The bucket, created on first use."""
    try:
        return await js.object_store(bucket)
    except nats.js.errors.BucketNotFoundError:
        return await js.create_object_store(bucket=bucket)


async def put_object(js: JetStreamContext, bucket: str, name: str, data: bytes) -> None:
    store = await object_store(js, bucket)
    await store.put(name, data)


async def get_object(js: JetStreamContext, bucket: str, name: str) -> bytes | None:
    """The object's bytes, or None when it does not exist."""
    store = await object_store(js, bucket)
    try:
        result = await store.get(name)
    except (nats.js.errors.ObjectNotFoundError, nats.js.errors.ObjectDeletedError):
        return None
    return bytes(result.data) if result.data is not None else None
