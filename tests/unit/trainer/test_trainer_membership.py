"""The coordinator's view of a job's trainers: the names of trainers that said they left are
kept only until their member key vanishes, so a long job with many short-lived trainers holds
a bounded set (issue 25), and a trainer that left is never reported as crashed."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from tideshift.events import Envelope, TrainerMembership
from tideshift.events.tokens import encode_token
from tideshift.services.common.clock import WALL_CLOCK
from tideshift.services.trainer.busport import member_key
from tideshift.services.trainer.coordinator import Membership

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
    assert membership.left == set() and membership.known == set()
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
