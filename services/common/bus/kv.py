"""NATS key/value: pydantic models under keys (`TypedKV`) and a leader lease (`Lease`).

Both use the bucket's compare-and-set, so two writers can never both win a round.
"""

from __future__ import annotations

import contextlib
import json
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TypeVar

import nats.errors
import nats.js.errors
from nats.aio.msg import Msg
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy
from nats.js.client import JetStreamContext
from nats.js.kv import KeyValue
from pydantic import BaseModel

from tideshift.services.common.clock import Clock, utc_now

log = logging.getLogger("tideshift.bus")
M = TypeVar("M", bound=BaseModel)


# JetStream's error code for a compare-and-set that lost (some servers send it as a plain
# bad request rather than as KeyWrongLastSequenceError).
WRONG_LAST_SEQUENCE = 10071
# How long the server keeps a key listing's consumer if its deletion is lost; keys per fetch.
LISTING_IDLE_SECONDS = 2.0
LISTING_BATCH = 256
# A key's last message marks it deleted or purged: by the client's header, or (nats-server
# 2.11+, a TTL or age expiry) by the server's marker.
_REMOVED_OPERATIONS = frozenset({"DEL", "PURGE"})


def _removed(msg: Msg) -> bool:
    headers = msg.headers or {}
    return headers.get("KV-Operation") in _REMOVED_OPERATIONS or "Nats-Marker-Reason" in headers


class KVConflict(RuntimeError):
    """A compare-and-set on a KV key lost: someone else wrote it since it was read."""


@dataclass
class Lease:
    """Single-leader election on a KV key with compare-and-set and a time-to-live.

    The value holds the holder's name and an expiry time. A contender takes the key when it
    is absent (create) or expired (update at the revision it read), so two contenders can
    never both succeed; the holder renews with the same compare-and-set before expiry.
    Clocks of contenders are assumed roughly in sync (well under the TTL).
    """

    kv: KeyValue
    key: str
    holder: str
    ttl_seconds: float
    # Whose time the expiry is in when `try_acquire` is given none (None: the wall clock).
    clock: Clock | None = None
    _revision: int | None = field(default=None, init=False)

    @property
    def held(self) -> bool:
        return self._revision is not None

    async def try_acquire(self, now: datetime | None = None) -> bool:
        """Acquire or renew; returns whether this holder leads now."""
        if now is None:
            now = utc_now(self.clock) if self.clock is not None else datetime.now(UTC)
        value = json.dumps(
            {"holder": self.holder, "expires_at": now.timestamp() + self.ttl_seconds}
        ).encode()
        try:
            entry = await self.kv.get(self.key)
        except (nats.js.errors.KeyNotFoundError, nats.js.errors.KeyDeletedError):
            entry = None
        try:
            if entry is None or entry.value is None:
                self._revision = await self.kv.create(self.key, value)
                return True
            current = json.loads(entry.value)
            mine = current.get("holder") == self.holder
            expired = float(current.get("expires_at", 0)) <= now.timestamp()
            if not (mine or expired):
                self._revision = None
                return False
            self._revision = await self.kv.update(self.key, value, last=entry.revision)
            return True
        except (nats.js.errors.KeyWrongLastSequenceError, nats.js.errors.BadRequestError):
            # Someone else wrote between our read and our write: they won this round.
            self._revision = None
            return False
        # JSONDecodeError is a ValueError; a deeply nested value raises RecursionError.
        except (RecursionError, TypeError, ValueError, AttributeError):
            log.warning("lease %s holds an unreadable value; taking it over", self.key)
            self._revision = await self.kv.put(self.key, value)
            return True

    async def release(self) -> None:
        if self._revision is None:
            return
        with contextlib.suppress(nats.js.errors.Error):
            await self.kv.delete(self.key, last=self._revision)
        self._revision = None


class TypedKV:
    """A KV bucket holding pydantic models as JSON, under escaped keys."""

    def __init__(self, kv: KeyValue, *, js: JetStreamContext, bucket: str) -> None:
        self.raw = kv
        self.js = js
        self.bucket = bucket

    async def put(self, key: str, value: BaseModel) -> int:
        return await self.raw.put(key, value.model_dump_json().encode())

    async def expires_keys(self) -> bool:
        """Whether the bucket lets a key carry its own TTL (nats-server 2.11 or later)."""
        status = await self.raw.status()
        return bool(status.stream_info.config.allow_msg_ttl)

    async def put_expiring(self, key: str, value: BaseModel, *, ttl_seconds: int) -> None:
        """Put a value that goes by itself `ttl_seconds` after, unless put again (a lease's
        renewal). nats-py's `KeyValue.put` takes no TTL: the `Nats-TTL` header does it."""
        subject = f"$KV.{self.bucket}.{key}"
        await self.js.publish(subject, value.model_dump_json().encode(), msg_ttl=ttl_seconds)

    async def purge_expiring(self, key: str, *, ttl_seconds: int) -> None:
        """Remove a key with a marker that expires too (markers of short-lived names, such as
        pod names, would otherwise stay for ever)."""
        await self.raw.purge(key, msg_ttl=ttl_seconds)

    async def get(self, key: str, model: type[M]) -> M | None:
        value, _ = await self.get_revision(key, model)
        return value

    async def get_revision(self, key: str, model: type[M]) -> tuple[M | None, int | None]:
        """The value and the revision to pass to `update`: (None, None) when absent, and
        (None, revision) when the stored value no longer validates (logged), so a caller can
        overwrite a damaged value by compare-and-set instead of failing on it."""
        try:
            entry = await self.raw.get(key)
        except (nats.js.errors.KeyNotFoundError, nats.js.errors.KeyDeletedError):
            return None, None
        if entry.value is None:
            return None, entry.revision
        try:
            return model.model_validate_json(entry.value), entry.revision
        except ValueError as error:
            log.warning("KV %s: unreadable value at %s: %s", self.raw._name, key, error)
            return None, entry.revision

    async def update(self, key: str, value: BaseModel, *, revision: int | None) -> int:
        """Compare-and-set: write only if the key is still at `revision` (None = absent)."""
        data = value.model_dump_json().encode()
        try:
            if revision is None:
                return await self.raw.create(key, data)
            return await self.raw.update(key, data, last=revision)
        except nats.js.errors.KeyWrongLastSequenceError as error:
            raise KVConflict(f"{key}: {error}") from error
        except nats.js.errors.BadRequestError as error:
            if error.err_code == WRONG_LAST_SEQUENCE:
                raise KVConflict(f"{key}: {error}") from error
            raise

    async def delete(self, key: str) -> None:
        with contextlib.suppress(nats.js.errors.KeyNotFoundError):
            await self.raw.delete(key)

    async def keys(self) -> list[str]:
        """Every key that holds a value (deleted and purged keys left out)."""
        prefix = f"$KV.{self.bucket}."
        return [msg.subject[len(prefix) :] for msg in await self._latest(headers_only=True)]

    async def values(self) -> dict[str, bytes]:
        """Every key's current value (deleted and purged keys left out), read in one pass
        rather than one request per key: thousands of keys in a fraction of the time."""
        prefix = f"$KV.{self.bucket}."
        return {
            msg.subject[len(prefix) :]: msg.data for msg in await self._latest(headers_only=False)
        }

    async def _latest(self, *, headers_only: bool) -> list[Msg]:
        """The latest message of every key that holds a value."""
        # Not `KeyValue.keys()`: its consumer stays on the server for five minutes after the
        # listing, and a stream holds at most 1,000 consumers (four coordinators listing
        # their members twice a second ran a bucket out in two minutes); and under load its
        # end-of-listing marker can overtake the keys, listing none. A pull consumer knows
        # how many keys it will deliver before delivering any, and is deleted afterwards.
        prefix = f"$KV.{self.bucket}."
        stream = f"KV_{self.bucket}"
        listing = await self.js.pull_subscribe(
            prefix + ">",
            stream=stream,
            config=ConsumerConfig(
                deliver_policy=DeliverPolicy.LAST_PER_SUBJECT,
                ack_policy=AckPolicy.NONE,
                headers_only=headers_only,
                mem_storage=True,
                inactive_threshold=LISTING_IDLE_SECONDS,
            ),
        )
        info = await listing.consumer_info()
        try:
            remaining = info.num_pending or 0
            latest: list[Msg] = []
            while remaining > 0:
                try:
                    batch = await listing.fetch(min(remaining, LISTING_BATCH), timeout=2)
                except nats.errors.TimeoutError:  # what was counted expired before delivery
                    break
                latest += [msg for msg in batch if not _removed(msg)]
                remaining = batch[-1].metadata.num_pending
            return latest
        finally:
            await listing.unsubscribe()
            with contextlib.suppress(nats.errors.Error):
                await self.js.delete_consumer(stream, info.name)

    async def items(self, model: type[M]) -> AsyncIterator[tuple[str, M]]:
        """Every current value that still validates; bad values are logged and skipped."""
        for key in await self.keys():
            value = await self.get(key, model)
            if value is not None:
                yield key, value
