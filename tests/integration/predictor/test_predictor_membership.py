"""Predictor membership on a real nats-server: keys expire by the server's per-key TTL, a
stalled member stops acting before its key is gone, a newcomer waits for the others to have
seen it, and a member that leaves hands its share over at the others' next renewal."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from typing import Literal

import pytest
from nats.js.api import StreamConfig

from tideshift.events import Resources, ServingPolicy, WorkloadChanged, WorkloadRef
from tideshift.services.common.bus import Bus
from tideshift.services.common.clock import WallClock
from tideshift.services.common.runtime import ServiceContext
from tideshift.services.predictor.core.shards import owner
from tideshift.services.predictor.membership import (
    Membership,
    MembershipUnsupported,
    parse_members,
    replica_key,
)
from tideshift.services.predictor.service import KNOWN_PER_FORECAST, Fleet, build_source
from tideshift.services.predictor.settings import PredictorSettings

WORKLOADS = [f"Deployment.apps/shop/web-{i}" for i in range(40)]
POLL_S = 0.05


def settings(unique: str) -> PredictorSettings:
    return PredictorSettings(
        sharded=True,
        members_bucket=f"members_{unique}",
        lease_ttl_seconds=2,
        lease_refresh_seconds=0.5,
        health_port=-1,
    )


async def test_a_stalled_member_stops_acting_before_the_others_see_its_key_expire(
    bus: Bus, unique: str
) -> None:
    a = Membership(bus, settings(unique), "a")
    b = Membership(bus, settings(unique), "b")
    for member in (a, b) * 3:  # until each has written a view with the other in it
        await member.renew()
    assert a.shard.acting(a.clock.now()) and b.shard.acting(b.clock.now())
    assert {w for w in WORKLOADS if a.owns(w)} == {w for w in WORKLOADS if owner(w, "ab") == "a"}
    stalled_at = a.shard.renewed_sent
    assert stalled_at is not None
    # a renews no more (a stall, a partition); b keeps renewing until a's key is gone.
    async with asyncio.timeout(10):
        while "a" in b.shard.members:
            await b.renew()
            await asyncio.sleep(POLL_S)
    gone = b.clock.now()
    # The server kept a's key at least a TTL after a sent its last put; a had given up a
    # refresh period before that.
    assert gone >= stalled_at + 2 - POLL_S
    assert not a.shard.acting(stalled_at + 2 - 0.5)
    assert all(b.owns(w) for w in WORKLOADS)


async def test_a_newcomer_acts_once_the_others_have_seen_it(bus: Bus, unique: str) -> None:
    a = Membership(bus, settings(unique), "a")
    c = Membership(bus, settings(unique), "c")
    await a.renew()
    assert all(a.owns(w) for w in WORKLOADS)  # alone: at once
    await c.renew()
    assert not any(c.owns(w) for w in WORKLOADS)  # a still forecasts everything it knows of
    await a.renew()  # a lists c: from now on a forecasts only its own share
    assert not all(a.owns(w) for w in WORKLOADS)
    await c.renew()  # ...not acknowledged yet: a's key still holds its older view
    assert not c.shard.acting(c.clock.now())
    await a.renew()  # a's key now holds a view with c
    await c.renew()
    assert {w for w in WORKLOADS if c.owns(w)} == {w for w in WORKLOADS if owner(w, "ac") == "c"}


async def test_a_member_that_leaves_is_gone_at_the_next_listing(bus: Bus, unique: str) -> None:
    a = Membership(bus, settings(unique), "a")
    b = Membership(bus, settings(unique), "b")
    for member in (a, b) * 3:
        await member.renew()
    await a.leave()
    await b.renew()
    assert b.shard.members == {"b"}
    assert all(b.owns(w) for w in WORKLOADS)


def test_an_unreadable_member_still_counts_and_a_bad_replica_name_is_refused() -> None:
    members = parse_members(
        {"members.a": b'{"replica": "a", "seen": ["a", "b"]}', "members.b": b"{oops", "x.c": b""}
    )
    assert set(members) == {"a", "b"}
    assert members["b"].seen == frozenset()
    with pytest.raises(ValueError, match="instance 'web 1': expected letters"):
        replica_key("web 1")


async def test_a_bucket_that_cannot_expire_keys_is_refused_at_start(bus: Bus, unique: str) -> None:
    # As nats-server 2.10 keeps it: no per-message TTL, a dead replica's key would stay.
    bucket = f"members_{unique}"
    await bus.js.add_stream(
        StreamConfig(name=f"KV_{bucket}", subjects=[f"$KV.{bucket}.>"], max_msgs_per_subject=1)
    )
    with pytest.raises(MembershipUnsupported, match=r"need nats-server 2\.11 or later"):
        await Membership(bus, settings(unique), "a").open()


def announced(ref: WorkloadRef, change: Literal["added", "deleted"] = "added") -> WorkloadChanged:
    return WorkloadChanged(
        change=change,
        workload=ref,
        role="serving",
        replicas=1,
        requests=Resources(cpu=0.1),
        serving=ServingPolicy(capacity_rps=10),
        observed_at=datetime.now(UTC),
    )


async def test_a_sharded_fleet_forecasts_its_share_and_takes_the_rest_when_alone(
    bus: Bus, unique: str
) -> None:
    config = settings(unique).model_copy(
        update={"metric_source": "sim", "model": "tidal", "max_announced_workloads": 1}
    )
    a = Membership(bus, config, "a")
    b = Membership(bus, config, "b")
    context = ServiceContext(name="predictor", settings=config, bus=bus, instance="a")
    fleet = Fleet(config, context, clock=WallClock(), source=build_source(config), membership=a)
    refs = [WorkloadRef(unique, "Deployment", f"web-{i}") for i in range(KNOWN_PER_FORECAST + 5)]
    try:
        for member in (a, b) * 3:
            await member.renew()
        for ref in refs:
            fleet.apply(announced(ref))
        # Remembered up to KNOWN_PER_FORECAST x max_announced_workloads; the rest counted.
        assert list(fleet.wanted) == [announced(r).workload for r in refs[:KNOWN_PER_FORECAST]]
        mine = [w for w in fleet.wanted if owner(str(w), ["a", "b"]) == "a"]
        assert mine and set(fleet.loops) == {mine[0]}  # its share, up to its own cap of 1
        await b.leave()
        await a.renew()
        fleet.reconcile()
        assert set(fleet.loops) == {mine[0]}  # alone, every workload is its: its cap holds
        fleet.apply(announced(mine[0], change="deleted"))
        assert mine[0] not in fleet.wanted and not fleet.loops
        fleet.reconcile()  # a slot is free: the first remembered workload, b's or not
        assert set(fleet.loops) == {next(iter(fleet.wanted))}
        await asyncio.sleep(0)  # its task starts before it is stopped (no unawaited loops)
    finally:
        await fleet.stop_all()
