"""Services on the in-memory bus and virtual time: a `ManualClock`, a broker on it, and the
test's own connection (`running` and `collect` are in tests/fixtures/support.py)."""

from __future__ import annotations

import pytest

from tests.fixtures.support import NOW
from tideshift.services.common.bus.memory import MemoryBroker, MemoryBus
from tideshift.services.common.clock import ManualClock


@pytest.fixture
def clock() -> ManualClock:
    """Virtual time from the builders' `NOW`, so events stamped then are fresh."""
    return ManualClock(start=NOW.timestamp())


@pytest.fixture
def broker(clock: ManualClock) -> MemoryBroker:
    return MemoryBroker(clock)


@pytest.fixture
def bus(broker: MemoryBroker) -> MemoryBus:
    """The test's own connection (another service's, as it were)."""
    return broker.connect("test")
