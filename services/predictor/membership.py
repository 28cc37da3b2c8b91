"""Sharded predictor replicas: this replica's membership key on NATS, and the live members.

Each replica puts `members.<replica>` in the members bucket every `lease_refresh_seconds`,
with a per-key TTL of `lease_ttl_seconds` (nats-server 2.11+ expires the key by itself; the
bucket has no age limit, so each replica's TTL is its own setting), then lists the keys. The
value carries the members this replica acted on at its previous listing, which a newcomer
waits for. Which workloads are this replica's, and the timing that lets an old owner give up
before a new one takes over, are decided in `shards.py`; this module only does the I/O.
Times are read from a monotonic clock: the server's TTL runs in real time, whatever clock
the service's forecasts follow (the demo's is simulated), and a step of the wall clock must
not stretch a lease.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from prometheus_client import Counter, Gauge
from pydantic import BaseModel, ConfigDict, Field

from tideshift.services.common.bus.kv import TypedKV
from tideshift.services.common.bus.port import BusPort
from tideshift.services.common.clock import wait_for_event
from tideshift.services.predictor.core.shards import Member, Shard
from tideshift.services.predictor.settings import PredictorSettings

log = logging.getLogger("tideshift.predictor")

KEY_PREFIX = "members."
# What a NATS KV key may hold (nats-py's own check, which would fail later and less clearly).
VALID_REPLICA = re.compile(r"^[-/_=.a-zA-Z0-9]+$")
# A listing larger than this is not a set of predictor replicas: its extra members are ignored.
MAX_MEMBERS = 1000

MEMBERS = Gauge(
    "tideshift_predictor_live_replicas", "live predictor replicas this one sees (sharded)"
)
ACTING = Gauge("tideshift_predictor_shard_acting", "1 while this replica forecasts its share")
RENEWALS_FAILED = Counter(
    "tideshift_predictor_lease_renewals_failed_total", "membership renewals that failed"
)
UNREADABLE = Counter(
    "tideshift_predictor_members_unreadable_total",
    "member values that did not parse (the member counts, its view as empty)",
)


class MembershipUnsupported(RuntimeError):
    """The NATS server cannot expire a member's key by itself."""


class MemberRecord(BaseModel):
    """A member key's value: the members its replica acted on at its previous listing."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    replica: str = Field(min_length=1)
    seen: list[str] = Field(default_factory=list, max_length=MAX_MEMBERS)


class MonotonicClock:
    """Seconds that never step: lease intervals are measured on it."""

    def now(self) -> float:
        return time.monotonic()

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(max(0.0, seconds))


def replica_key(replica: str) -> str:
    if not VALID_REPLICA.match(replica):
        raise ValueError(
            f"instance {replica!r}: expected letters, digits, '-', '_', '=', '/' or '.' "
            "(it names this replica's membership key)"
        )
    return KEY_PREFIX + replica


def parse_members(values: dict[str, bytes]) -> dict[str, Member]:
    """The listed members: an unreadable value still names a live member (logged, counted)."""
    members: dict[str, Member] = {}
    for key, value in values.items():
        if not key.startswith(KEY_PREFIX) or len(members) >= MAX_MEMBERS:
            continue
        replica = key[len(KEY_PREFIX) :]
        try:
            seen = frozenset(MemberRecord.model_validate_json(value).seen)
        except ValueError as error:
            UNREADABLE.inc()
            log.warning("member %s: unreadable value, taken as seeing nobody: %s", key, error)
            seen = frozenset()
        members[replica] = Member(replica, seen)
    return members


@dataclass
class Membership:
    """This replica's key in the members bucket, renewed until the service stops."""

    bus: BusPort
    settings: PredictorSettings
    replica: str
    clock: MonotonicClock = field(default_factory=MonotonicClock)
    shard: Shard = field(init=False)
    failing: bool = field(default=False, init=False)  # logged once per outage
    _kv: TypedKV | None = field(default=None, init=False)

    def __post_init__(self) -> None:
        self.key = replica_key(self.replica)
        self.shard = Shard(
            self.replica, self.settings.lease_ttl_seconds, self.settings.lease_refresh_seconds
        )

    def owns(self, workload: str) -> bool:
        return self.shard.owns(workload, self.clock.now())

    async def _bucket(self) -> TypedKV:
        if self._kv is None:
            # No age limit: each key carries its TTL (created here on an open NATS only).
            kv = await self.bus.kv(self.settings.members_bucket)
            if not await kv.expires_keys():
                # nats-server 2.10 keeps the key of a dead replica for ever: its share would
                # never be forecast again. Refuse rather than fail silently.
                raise MembershipUnsupported(
                    f"members_bucket {kv.bucket!r}: the server does not expire keys by "
                    "themselves (per-message TTL); sharded predictors need nats-server 2.11 "
                    "or later"
                )
            self._kv = kv
        return self._kv

    async def open(self) -> None:
        """Check the bucket at start: a server that cannot expire keys stops the service;
        NATS away or slow is left to the renewals."""
        try:
            await self._bucket()
        except MembershipUnsupported:
            raise
        except Exception as error:
            log.warning("members bucket not open yet (retried each renewal): %s", error)

    async def renew(self) -> None:
        """One round: put this replica's key, list the members, update the shard."""
        kv = await self._bucket()
        record = MemberRecord(replica=self.replica, seen=sorted(self.shard.members))
        sent = self.clock.now()
        await kv.put_expiring(self.key, record, ttl_seconds=self.settings.lease_ttl_seconds)
        acked = self.clock.now()
        members = parse_members(await kv.values())
        self.shard.renewed(sent=sent, acked=acked, members=members)
        MEMBERS.set(len(self.shard.members))

    async def keep(self, stopping: asyncio.Event, on_change: Callable[[], None]) -> None:
        """Renew every `lease_refresh_seconds` until `stopping`; `on_change` after each round
        (a failed one too: the share is dropped once the authority lapses)."""
        while not stopping.is_set():
            try:
                await self.renew()
                if self.failing:
                    log.info("membership renewed again (%s)", self.settings.members_bucket)
                self.failing = False
            except Exception as error:  # NATS away or slow: retried next period
                RENEWALS_FAILED.inc()
                if not self.failing:
                    log.warning(
                        "membership renewal failed; this replica stops forecasting %.0f s "
                        "after its last renewal unless one succeeds: %s",
                        self.settings.lease_ttl_seconds - self.settings.lease_refresh_seconds,
                        error,
                    )
                self.failing = True
            ACTING.set(1 if self.shard.acting(self.clock.now()) else 0)
            on_change()
            await wait_for_event(self.clock, stopping, self.settings.lease_refresh_seconds)

    async def leave(self) -> None:
        """Remove this replica's key (after its loops stopped): the others take its share at
        their next listing instead of after the TTL. A purge whose marker expires too: pods
        come and go, and a marker per pod name would stay for ever."""
        if self._kv is not None:
            with contextlib.suppress(Exception):
                await self._kv.purge_expiring(self.key, ttl_seconds=self.settings.lease_ttl_seconds)
