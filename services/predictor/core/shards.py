"""Which predictor replica forecasts which workload, and when a replica may act on its share.

Ownership is rendezvous (highest-random-weight) hashing over the live members: a workload
goes to the member whose hash of (member, workload) is highest. Every replica computes the same
owner from the same member list without a coordinator, and a join or a death moves only the
workloads the newcomer wins or the dead one held, about 1/N of them.

Authority, with T the lease TTL and p the refresh period (p <= T/3, `PredictorSettings`):

* A member renews its key every p, the key living T after the server stores it. The server
  stores a put after the member sent it, so the key lives until at least `sent + T`.
* A member acts on its share only until `sent + T - p`, `sent` being when it sent the last
  put that was acknowledged and followed by a listing of the members. Cut off (a partition,
  a stall), it stops at least p before its key can expire; the others take its workloads only
  once its key is gone. The old owner gives up first, by p, which also covers a forecast
  already on its way. Only the rates of the clocks matter, not their offsets (each side
  measures its own interval).
* A newcomer (a first put, or the first after its authority lapsed) that finds other members
  acts once each of them has written a view (`Member.seen`) that includes it: a member writes
  with each put the members it acted on at its last listing, after it dropped what the
  newcomer now owns. At the latest it acts T after its put was acknowledged: a member whose
  view lacked it listed before that put was stored, so renewed before, and its authority
  ended before `stored + T - p`. Alone, it acts at once (nobody else has authority).

Gaps: a dead member's workloads are forecast again within T + p of its last renewal (the key
expires, the survivors' next listing sees it) plus the new owner's first forecast; a
newcomer's share pauses for about two refresh periods (the others' next puts), T at most.
Pure: time is an argument (seconds of one monotonic clock), no I/O.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Member:
    """A live member as listed: its replica id and the members it acted on (its view)."""

    replica: str
    seen: frozenset[str] = frozenset()


def weight(replica: str, workload: str) -> int:
    """The member's rendezvous weight for the workload: the same on every replica (a stable
    hash, not Python's salted `hash`)."""
    digest = hashlib.blake2b(f"{replica}\n{workload}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big")


def owner(workload: str, members: Collection[str]) -> str | None:
    """The member that forecasts `workload`; None without members. Ties (a 64-bit collision)
    go to the greater replica id, so every replica still agrees."""
    if not members:
        return None
    return max(members, key=lambda replica: (weight(replica, workload), replica))


@dataclass
class Shard:
    """One replica's view of the membership and its authority to act on its share."""

    me: str
    ttl_s: float
    refresh_s: float
    members: frozenset[str] = frozenset()
    # When the last acknowledged put (followed by a listing) was sent; None: never.
    renewed_sent: float | None = None
    # When this run of membership began (its first put's acknowledgement).
    joined_at: float = math.inf
    # Every other member has written a view that includes this one.
    acknowledged: bool = False
    _owners: dict[str, bool] = field(default_factory=dict, repr=False)

    def active(self, now: float) -> bool:
        """Whether the last renewal still backs this replica's authority at `now`."""
        if self.renewed_sent is None:
            return False
        return now < self.renewed_sent + self.ttl_s - self.refresh_s

    def renewed(self, *, sent: float, acked: float, members: Mapping[str, Member]) -> None:
        """A round succeeded: a put sent at `sent` and acknowledged at `acked`, then the
        members listed (this replica's own key among them or not: it is a member)."""
        if not self.active(sent):  # the first round, or authority lapsed: join again
            self.joined_at = acked
            self.acknowledged = False
        self.renewed_sent = sent
        view = frozenset(members) | {self.me}
        if view != self.members:
            self._owners.clear()
        self.members = view
        others = [member for replica, member in members.items() if replica != self.me]
        self.acknowledged = self.acknowledged or all(self.me in m.seen for m in others)

    def acting(self, now: float) -> bool:
        """Whether this replica may forecast its share at `now`."""
        if not self.active(now):
            return False
        return self.acknowledged or now >= self.joined_at + self.ttl_s

    def owns(self, workload: str, now: float) -> bool:
        """Whether this replica may forecast `workload` at `now`."""
        if not self.acting(now):
            return False
        mine = self._owners.get(workload)
        if mine is None:
            # Cached per view: the forecast loops ask before every publish.
            mine = self._owners[workload] = owner(workload, self.members) == self.me
        return mine

    def forget(self, workload: str) -> None:
        """Drop a removed workload's cached owner (memory stays bounded by the workloads)."""
        self._owners.pop(workload, None)
