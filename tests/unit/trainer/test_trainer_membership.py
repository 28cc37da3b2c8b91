"""The coordinator's view of a job's trainers: the names of trainers that said they left are
kept only until their member key vanishes, so a long job with many short-lived trainers holds
a bounded set (issue 25), and a trainer that left is never reported as crashed."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from tideshift.events import Envelope, TrainerMembership
from tideshift.events.tokens import encode_token
from tideshift.services.common.clock import WALL_CLOCK
from tideshift.services.trainer.coordinator.service import Membership
from tideshift.services.trainer.port.bus import member_key

JOB = "job-a"


class FakeMembers:
    """The members bucket as the coordinator reads it: the keys of live trainers."""

    def __init__(self) -> None:
        self.live: set[str] = set()

    async def keys(self) -> list[str]:
        return [member_key(JOB, trainer) for trainer in self.live]


class FakeBus:
    def __init__(self) -> None:
        self.published: list[TrainerMembership] = []

    async def publish(self, subject: str, data: TrainerMembership) -> None:
        self.published.append(data)


def left(trainer: str) -> Envelope[TrainerMembership]:
    data = TrainerMembership(job=JOB, trainer=trainer, change="left", at=datetime.now(UTC))
    return Envelope(id=trainer, source="test", type="left", time=None, subject=None, data=data)


async def test_trainers_that_left_are_forgotten_once_their_keys_vanish() -> None:
    bus, members = FakeBus(), FakeMembers()
    membership = Membership(bus, JOB, WALL_CLOCK)  # type: ignore[arg-type]
    kv: Any = members
    for wave in range(50):
        names = [f"t-{wave}-{i}" for i in range(40)]
        members.live = set(names)
        assert await membership.refresh(kv) == 40
        for name in names:
            membership._on_change(left(name))  # a clean leave, then its key goes
        members.live = set()
        assert await membership.refresh(kv) == 0
        # A late `left` (the key vanished before the event arrived) is dropped next time.
        membership._on_change(left(f"late-{wave}"))
        assert len(membership.left) <= 1
    assert await membership.refresh(kv) == 0
    assert not membership.left and membership.known == set()
    assert bus.published == []  # every one of the 2,000 left; none crashed


async def test_a_trainer_whose_key_vanishes_without_leaving_is_reported_crashed() -> None:
    bus, members = FakeBus(), FakeMembers()
    membership = Membership(bus, JOB, WALL_CLOCK)  # type: ignore[arg-type]
    kv: Any = members
    members.live = {"quiet", "polite"}
    await membership.refresh(kv)
    membership._on_change(left("polite"))
    members.live = set()
    await membership.refresh(kv)
    assert [(m.trainer, m.change) for m in bus.published] == [("quiet", "crashed")]
    assert encode_token("quiet") not in membership.known


async def test_left_names_are_bounded_between_refreshes_oldest_first() -> None:
    """A flood of `left` for names nobody saw (no refresh meanwhile: the coordinator waits for
    its lease) keeps at most the limit, the newest ones."""
    membership = Membership(FakeBus(), JOB, WALL_CLOCK, left_limit=100)  # type: ignore[arg-type]
    for i in range(10_000):
        membership._on_change(left(f"flood-{i}"))
    assert list(membership.left) == [f"flood-{i}" for i in range(9_900, 10_000)]


async def test_a_live_trainer_that_left_is_never_evicted_by_a_flood() -> None:
    """Its key is still there: forgetting its `left` would report it crashed when the key
    vanishes."""
    bus, members = FakeBus(), FakeMembers()
    membership = Membership(bus, JOB, WALL_CLOCK, left_limit=10)  # type: ignore[arg-type]
    kv: Any = members
    members.live = {"polite"}
    await membership.refresh(kv)
    membership._on_change(left("polite"))
    for i in range(1_000):
        membership._on_change(left(f"flood-{i}"))
    assert list(membership.left) == ["polite", *(f"flood-{i}" for i in range(991, 1_000))]
    members.live = set()
    await membership.refresh(kv)
    assert bus.published == [] and not membership.left
