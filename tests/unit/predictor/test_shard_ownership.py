"""Rendezvous ownership and a replica's authority over its share (predictor/core/shards.py),
with time stepped explicitly."""

from __future__ import annotations

from collections import Counter

from tideshift.services.predictor.core.shards import Member, Shard, owner

WORKLOADS = [f"shop/Deployment/web-{i}" for i in range(3000)]
TTL, REFRESH = 15.0, 5.0


def members(*replicas: str, seen: tuple[str, ...] = ()) -> dict[str, Member]:
    return {r: Member(r, frozenset(seen or replicas)) for r in replicas}


def test_every_workload_has_one_owner_and_shares_are_even() -> None:
    owners = Counter(owner(w, ["a", "b", "c"]) for w in WORKLOADS)
    assert set(owners) == {"a", "b", "c"}
    assert all(900 <= count <= 1100 for count in owners.values()), owners
    assert owner("x", []) is None


def test_the_owner_does_not_depend_on_the_order_of_the_members() -> None:
    assert [owner(w, ["a", "b", "c"]) for w in WORKLOADS] == [
        owner(w, ["c", "a", "b"]) for w in WORKLOADS
    ]


def test_a_join_or_a_death_moves_only_the_share_of_that_member() -> None:
    before = {w: owner(w, ["a", "b", "c"]) for w in WORKLOADS}
    joined = {w: owner(w, ["a", "b", "c", "d"]) for w in WORKLOADS}
    moved = [w for w in WORKLOADS if before[w] != joined[w]]
    assert all(joined[w] == "d" for w in moved)
    assert 600 <= len(moved) <= 900  # about a quarter
    died = {w: owner(w, ["a", "c"]) for w in WORKLOADS}
    moved = [w for w in WORKLOADS if before[w] != died[w]]
    assert all(before[w] == "b" for w in moved)
    assert len(moved) == sum(1 for w in WORKLOADS if before[w] == "b")


def test_alone_a_replica_acts_at_once_and_owns_everything() -> None:
    shard = Shard("a", TTL, REFRESH)
    assert not shard.owns(WORKLOADS[0], 0.0)
    shard.renewed(sent=0.0, acked=0.1, members=members("a"))
    assert all(shard.owns(w, 0.2) for w in WORKLOADS[:50])


def test_authority_ends_one_refresh_period_before_the_key_can_expire() -> None:
    shard = Shard("a", TTL, REFRESH)
    shard.renewed(sent=100.0, acked=100.1, members=members("a"))
    assert shard.acting(100.0 + TTL - REFRESH - 0.01)
    # The key lives until at least sent + TTL; the replica stopped p before.
    assert not shard.acting(100.0 + TTL - REFRESH)
    assert not shard.owns(WORKLOADS[0], 100.0 + TTL - 1)


def test_a_newcomer_waits_for_every_other_member_to_have_seen_it() -> None:
    shard = Shard("d", TTL, REFRESH)
    shard.renewed(sent=0.0, acked=0.1, members=members("a", "b", "d", seen=("a", "b")))
    assert not shard.acting(1.0)
    # b has written a view with d in it, a not yet.
    listed = members("a", "b", "d", seen=("a", "b")) | {"b": Member("b", frozenset("abd"))}
    shard.renewed(sent=5.0, acked=5.1, members=listed)
    assert not shard.acting(6.0)
    shard.renewed(sent=10.0, acked=10.1, members=members("a", "b", "d"))
    assert shard.acting(10.2)
    mine = [w for w in WORKLOADS if owner(w, ["a", "b", "d"]) == "d"]
    assert mine and all(shard.owns(w, 10.2) for w in mine)
    assert not any(shard.owns(w, 10.2) for w in WORKLOADS if w not in mine)


def test_a_newcomer_never_acknowledged_acts_one_ttl_after_its_first_put() -> None:
    shard = Shard("d", TTL, REFRESH)
    stalled = members("a", "d", seen=("a",))
    for now in (0.0, 5.0, 10.0, 15.0):
        shard.renewed(sent=now, acked=now + 0.1, members=stalled)
    assert not shard.acting(15.0)
    assert shard.acting(0.1 + TTL)


def test_a_lapsed_member_joins_again_and_waits_again() -> None:
    shard = Shard("a", TTL, REFRESH)
    shard.renewed(sent=0.0, acked=0.1, members=members("a", "b"))
    assert shard.acting(1.0)
    # Partitioned: no renewal until long after its authority ended.
    assert not shard.acting(TTL - REFRESH)
    shard.renewed(sent=60.0, acked=60.1, members=members("a", "b", seen=("b",)))
    assert not shard.acting(61.0)


def test_when_a_member_dies_the_survivors_take_its_share() -> None:
    shard = Shard("a", TTL, REFRESH)
    shard.renewed(sent=0.0, acked=0.1, members=members("a", "b", "c"))
    theirs = [w for w in WORKLOADS if owner(w, ["a", "b", "c"]) == "b"]
    assert not any(shard.owns(w, 1.0) for w in theirs)
    shard.renewed(sent=5.0, acked=5.1, members=members("a", "c"))
    taken = [w for w in theirs if shard.owns(w, 5.2)]
    assert taken and all(owner(w, ["a", "c"]) == "a" for w in taken)
