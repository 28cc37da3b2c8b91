"""Three `tideshift run predictor` processes share 30 announced workloads over a real
nats-server: each workload is forecast by the replica that owns it and by no other at the
same time; after a SIGKILL the survivors forecast the dead one's workloads within the lease
TTL; a replica that joins takes its share.

Who forecast what is read from the `ForecastIssued` stream itself: each event's CloudEvents
`source` names the publishing process (`tideshift/predictor-<instance>/...`).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import time
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import pytest

from tests.k8s.cluster_objects import end_processes
from tideshift.events import FORECAST, Resources, ServingPolicy, WorkloadChanged, WorkloadRef
from tideshift.services.common.bus import Bus
from tideshift.services.common.embedded_nats import EmbeddedNats
from tideshift.services.predictor.core.shards import owner

TIDESHIFT = str(Path(sys.executable).parent / "tideshift")
WORKLOADS = 30
TTL_S, RENEW_S, FORECAST_S = 3, 1.0, 0.5
# A replica's forecasts of one workload closer than this belong to one run of ownership.
RUN_GAP_S = 4 * FORECAST_S
# After a SIGKILL: the key expires within TTL_S of the last renewal, the survivors' next
# listing within RENEW_S, then a first forecast (a `tidal` fit of a day of samples) is
# allowed FIRST_FORECAST_S on a loaded machine.
FIRST_FORECAST_S = 3.0
WAIT_S = 60.0


@dataclass
class Forecasts:
    """Every forecast of the test's workloads as received: (time, workload, replica)."""

    seen: list[tuple[float, str, str]] = field(default_factory=list)
    arrived: asyncio.Event = field(default_factory=asyncio.Event)

    def add(self, workload: str, source: str) -> None:
        # source: tideshift/predictor-<instance>/<host>/<pid>
        replica = source.split("/")[1].removeprefix("predictor-")
        self.seen.append((time.monotonic(), workload, replica))
        self.arrived.set()

    def latest(self, since: float) -> dict[str, set[str]]:
        """The replicas that forecast each workload after `since`."""
        by: dict[str, set[str]] = defaultdict(set)
        for at, workload, replica in self.seen:
            if at >= since:
                by[workload].add(replica)
        return by

    def overlaps(self) -> list[str]:
        """Workloads two replicas forecast in runs that overlap in time."""
        runs: dict[str, list[tuple[float, float, str]]] = defaultdict(list)
        last: dict[tuple[str, str], int] = {}
        for at, workload, replica in self.seen:
            index = last.get((workload, replica))
            if index is not None and at - runs[workload][index][1] <= RUN_GAP_S:
                start, _, _ = runs[workload][index]
                runs[workload][index] = (start, at, replica)
            else:
                last[(workload, replica)] = len(runs[workload])
                runs[workload].append((at, at, replica))
        return [
            f"{workload}: {a[2]} {a[0]:.2f}-{a[1]:.2f} and {b[2]} {b[0]:.2f}-{b[1]:.2f}"
            for workload, spans in runs.items()
            for i, a in enumerate(spans)
            for b in spans[i + 1 :]
            if a[2] != b[2] and a[0] <= b[1] and b[0] <= a[1]
        ]


class Replicas:
    def __init__(self, nats: EmbeddedNats, unique: str, logs: Path) -> None:
        self.env = {
            **os.environ,
            "TIDESHIFT_NATS_URL": nats.url,
            "TIDESHIFT_HEALTH_PORT": "-1",
            "TIDESHIFT_METRIC_SOURCE": "sim",
            # Who forecasts is under test, not the model: `tidal` fits at once.
            "TIDESHIFT_MODEL": "tidal",
            "TIDESHIFT_STEP_SECONDS": "60",
            "TIDESHIFT_HORIZON_SECONDS": "600",
            "TIDESHIFT_HISTORY_SECONDS": "86400",
            "TIDESHIFT_REFRESH_SECONDS": str(FORECAST_S),
            "TIDESHIFT_OBSERVE_SECONDS": "0",
            "TIDESHIFT_SNAPSHOT_BUCKET": f"snap_{unique}",
            "TIDESHIFT_SHARDED": "true",
            "TIDESHIFT_MEMBERS_BUCKET": f"members_{unique}",
            "TIDESHIFT_LEASE_TTL_SECONDS": str(TTL_S),
            "TIDESHIFT_LEASE_REFRESH_SECONDS": str(RENEW_S),
        }
        self.logs = logs
        self.processes: dict[str, subprocess.Popen[bytes]] = {}

    def start(self, name: str) -> None:
        with (self.logs / f"{name}.log").open("ab") as log:
            self.processes[name] = subprocess.Popen(
                [TIDESHIFT, "run", "predictor", "--instance", name],
                env=self.env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
            )

    def kill(self, name: str) -> None:
        process = self.processes.pop(name)
        process.send_signal(signal.SIGKILL)
        process.wait(WAIT_S)

    def log(self, name: str) -> str:
        return (self.logs / f"{name}.log").read_text(errors="replace")[-3000:]


@pytest.fixture
def replicas(nats_server: EmbeddedNats, unique: str, tmp_path: Path) -> Iterator[Replicas]:
    state = Replicas(nats_server, unique, tmp_path)
    try:
        yield state
    finally:
        end_processes(list(state.processes.values()))


async def _announce(bus: Bus, unique: str) -> list[str]:
    """30 serving workloads in the test's snapshot bucket, as the watcher leaves them."""
    kv = await bus.kv(f"snap_{unique}")
    names = []
    for i in range(WORKLOADS):
        ref = WorkloadRef(f"t-{unique}", "Deployment", f"web-{i}")
        event = WorkloadChanged(
            change="added",
            workload=ref,
            role="serving",
            replicas=1,
            requests=Resources(cpu=0.1),
            serving=ServingPolicy(capacity_rps=10),
            observed_at=datetime.now(UTC),
        )
        await kv.put(f"workload.{unique}.{i}", event)
        names.append(str(event.workload))  # as forecast: the kind gets its API group
    return names


async def _settled(forecasts: Forecasts, workloads: list[str], live: list[str]) -> float:
    """Wait until every workload is forecast by its owner among `live` and by no one else
    for a while; the time it settled."""
    async with asyncio.timeout(WAIT_S):
        while True:
            window = time.monotonic() - 2 * RUN_GAP_S
            by = forecasts.latest(window)
            if all(by.get(w) == {owner(w, live)} for w in workloads):
                return window
            forecasts.arrived.clear()
            await forecasts.arrived.wait()


async def test_three_replicas_share_the_workloads_and_hand_them_over(
    bus: Bus, unique: str, replicas: Replicas
) -> None:
    workloads = await _announce(bus, unique)
    forecasts = Forecasts()

    async def listen() -> None:
        async for envelope in bus.subscribe(FORECAST.filter(namespace=f"t-{unique}"), consumer="t"):
            forecasts.add(str(envelope.data.workload), envelope.source)

    listener = asyncio.create_task(listen())
    await asyncio.sleep(0)
    await bus.flush()
    try:
        for name in ("r0", "r1", "r2"):
            replicas.start(name)
        await _settled(forecasts, workloads, ["r0", "r1", "r2"])

        theirs = [w for w in workloads if owner(w, ["r0", "r1", "r2"]) == "r1"]
        assert theirs, "r1 owns none of the 30 workloads: the test would show nothing"
        last = {w: max(at for at, wl, r in forecasts.seen if wl == w) for w in theirs}
        replicas.kill("r1")
        killed = time.monotonic()
        await _settled(forecasts, workloads, ["r0", "r2"])
        gaps = {
            w: min(at for at, wl, _ in forecasts.seen if wl == w and at > killed) - last[w]
            for w in theirs
        }
        print(f"r1's {len(theirs)} workloads: longest gap {max(gaps.values()):.2f} s")
        assert max(gaps.values()) <= TTL_S + RENEW_S + FIRST_FORECAST_S, gaps

        replicas.start("r3")
        await _settled(forecasts, workloads, ["r0", "r2", "r3"])
        assert any(owner(w, ["r0", "r2", "r3"]) == "r3" for w in workloads)
        assert forecasts.overlaps() == []
    except BaseException:
        for name in ("r0", "r1", "r2", "r3"):
            with contextlib.suppress(OSError):
                print(f"--- {name}\n{replicas.log(name)}")
        raise
    finally:
        listener.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await listener
