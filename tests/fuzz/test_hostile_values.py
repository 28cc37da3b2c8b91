"""Valid events at the edges of the contract, sent to the running planner and predictor
(processes on a real nats-server): extreme numbers, the longest legal names, far-future and
far-past times, floods of names nobody announced (issue 25, Definition of done).

After every case a fresh valid workload still gets its scale command, no idempotency key is
commanded twice, /healthz and /readyz answer 200, and neither service grew past the bound.
The watcher and the executor get theirs on the control plane: tests/k8s/test_hostile_k8s.py.
Runtime: ~30 s for the ten cases, 1-1.5 min on a loaded machine.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError

from tests.fuzz.hostile import Recorder, Services, one_seeded_draw, start_service
from tideshift import events
from tideshift.services.common.bus import Bus
from tideshift.services.common.embedded_nats import EmbeddedNats

pytestmark = pytest.mark.slow

WAIT = 60.0
KIND = "Deployment.apps"
# A DNS label character set: every name the strategies make is legal in Kubernetes.
DNS = st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789", min_size=1, max_size=1)

Publish = list[tuple[str, events.EventData]]


def ref(namespace: str, name: str) -> events.WorkloadRef:
    return events.WorkloadRef(kind=KIND, namespace=namespace, name=name)


def workload(namespace: str, name: str, capacity_rps: float = 10.0) -> Publish:
    event = events.WorkloadChanged(
        change="added",
        workload=ref(namespace, name),
        role="serving",
        replicas=1,
        requests=events.Resources(cpu=0.01),
        serving=events.ServingPolicy(capacity_rps=capacity_rps),
        observed_at=datetime.now(UTC),
    )
    subject = events.WORKLOAD_CHANGED.at(namespace=namespace, kind=KIND, name=name)
    return [(subject.value, event)]


def forecast(namespace: str, name: str, rps: float, at: datetime | None = None) -> Publish:
    start = at or datetime.now(UTC)
    points = tuple(
        events.ForecastPoint(
            at=start + timedelta(seconds=60 * k), point=rps, q50=rps, q90=rps, q95=rps, q99=rps
        )
        for k in range(10)
    )
    event = events.ForecastIssued(
        workload=ref(namespace, name), issued_at=start, step_seconds=60, model="m", points=points
    )
    return [(events.FORECAST.at(namespace=namespace, workload=name).value, event)]


def observed(namespace: str, name: str, rps: float, at: datetime) -> Publish:
    event = events.DemandObserved(workload=ref(namespace, name), rps=rps, observed_at=at)
    return [(events.DEMAND_OBSERVED.at(namespace=namespace, workload=name).value, event)]


def build(make: Callable[[], Publish]) -> Publish:
    """The case's events; none when the contract refuses the value where it enters (then the
    value is a dead letter, which the other fuzz suite accounts for)."""
    try:
        return make()
    except ValidationError:
        return []


class System:
    def __init__(self, nats: EmbeddedNats, services: Services) -> None:
        self.nats = nats
        self.services = services

    def healthy(self) -> None:
        self.services.healthy()


@pytest.fixture(scope="module")
def system(tmp_path_factory: pytest.TempPathFactory) -> Iterator[System]:
    logs = tmp_path_factory.mktemp("hostile-values")
    argvs = {
        "planner": ["--instance", "hostile", "--tick-seconds", "1"],
        "predictor": ["--metric-source", "sim", "--model", "tidal"],
    }
    with EmbeddedNats() as nats:
        services = Services({})
        try:
            for name, extra in argvs.items():
                services.services[name] = start_service(name, nats.url, logs, extra)
            services.wait_ready(WAIT)
            node = events.NodeChanged(
                change="added",
                name="big",
                allocatable=events.Resources(cpu=100_000.0, memory=2**50),
                observed_at=datetime.now(UTC),
            )
            asyncio.run(send(nats.url, [(events.NODE_CHANGED.at(name="big").value, node)]))
            yield System(nats, services)
        finally:
            services.stop()


async def send(url: str, batch: Publish) -> None:
    bus = await Bus.connect(url, name="hostile-values")
    try:
        for subject, event in batch:
            await bus.connection.publish(subject, events.encode(event, source="hostile"))
        await bus.flush()
    finally:
        await bus.close()


async def fresh_workload_is_commanded(url: str) -> None:
    """A new valid workload is commanded, under one idempotency key."""
    namespace, name = f"fresh-{uuid.uuid4().hex[:8]}", "web"
    bus = await Bus.connect(url, name="hostile-check")
    try:
        # Listening before the workload is sent: the planner commands it once, within a tick.
        commands = await Recorder(bus, events.SCALE_COMMAND.filter(namespace=namespace)).start()
        await send(url, workload(namespace, name) + forecast(namespace, name, 100.0))
        sent = await commands.wait_for(
            lambda seen: [c for c in seen if c.target.name == name], WAIT, "command"
        )
        # Sized up from its one replica for 100 req/s at 10 req/s each (ramp limits may cap
        # the first step), and for exactly one target: the namespace is new.
        assert sent[0].desired > 1
        assert {c.idempotency_key for c in commands.seen} == {sent[0].idempotency_key}
    finally:
        await bus.close()


def far(years: int) -> datetime:
    return datetime.now(UTC).replace(year=datetime.now(UTC).year + years)


CORPUS: dict[str, Callable[[], Publish]] = {
    "smallest capacity": lambda: workload("edge", "tiny", capacity_rps=5e-324),
    "huge capacity": lambda: workload("edge", "huge", capacity_rps=1e308),
    "longest names": lambda: workload("n" * 63, "w" * 253) + forecast("n" * 63, "w" * 253, 50.0),
    "huge forecast": lambda: workload("edge", "big") + forecast("edge", "big", 1e300),
    "demand in year 9999": lambda: observed(
        "edge", "tiny", 1e6, datetime(9999, 12, 31, tzinfo=UTC)
    ),
    "forecast from 1970": lambda: forecast("edge", "old", 5.0, datetime(1970, 1, 1, tzinfo=UTC)),
    "forecast a century ahead": lambda: forecast("edge", "ahead", 5.0, far(100)),
    "flood of unannounced forecasts": lambda: [
        item for i in range(3000) for item in forecast("flood", f"f-{i}", 1.0)
    ],
    "flood of unannounced demand": lambda: [
        item for i in range(3000) for item in observed("flood", f"o-{i}", 1.0, datetime.now(UTC))
    ],
}


@pytest.mark.parametrize("case", list(CORPUS))
def test_an_edge_value_stops_nothing(system: System, case: str) -> None:
    asyncio.run(send(system.nats.url, build(CORPUS[case])))
    asyncio.run(fresh_workload_is_commanded(system.nats.url))
    system.healthy()


@one_seeded_draw
@given(
    namespace=st.lists(DNS, min_size=63, max_size=63).map("".join),
    name=st.lists(DNS, min_size=253, max_size=253).map("".join),
    rps=st.floats(min_value=0, max_value=1e300, allow_nan=False),
    when=st.datetimes(min_value=datetime(1, 1, 2), max_value=datetime(9999, 12, 30)),
)
def test_drawn_edge_values_stop_nothing(
    system: System, namespace: str, name: str, rps: float, when: datetime
) -> None:
    at = when.replace(tzinfo=UTC)
    batch = build(lambda: workload(namespace, name) + observed(namespace, name, rps, at))
    batch += build(lambda: forecast(namespace, name, rps, at))
    asyncio.run(send(system.nats.url, batch))
    asyncio.run(fresh_workload_is_commanded(system.nats.url))
    system.healthy()
