"""NATS object store: whole objects (checkpoints) by name in a bucket."""

from __future__ import annotations

import nats.js.errors
from nats.js import JetStreamContext
from nats.js.object_store import ObjectStore


async def object_store(js: JetStreamContext, bucket: str, *, replicas: int = 1) -> ObjectStore:
    """The bucket, created on first use (kept on `replicas` servers of a cluster)."""
    try:
        return await js.object_store(bucket)
    except nats.js.errors.BucketNotFoundError:
        return await js.create_object_store(bucket=bucket, replicas=replicas)


async def put_object(
    js: JetStreamContext, bucket: str, name: str, data: bytes, *, replicas: int = 1
) -> None:
    store = await object_store(js, bucket, replicas=replicas)
    await store.put(name, data)


async def get_object(
    js: JetStreamContext, bucket: str, name: str, *, replicas: int = 1
) -> bytes | None:
    """The object's bytes, or None when it does not exist."""
    store = await object_store(js, bucket, replicas=replicas)
    try:
        result = await store.get(name)
    except (nats.js.errors.ObjectNotFoundError, nats.js.errors.ObjectDeletedError):
        return None
    return bytes(result.data) if result.data is not None else None
