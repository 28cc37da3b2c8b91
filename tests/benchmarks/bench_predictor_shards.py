"""Benchmark (issue 29 part 2): workloads per predictor replica-core, 1 against 3 sharded
replicas, and the hand-over time after a replica is SIGKILLed.

Real `tideshift run predictor` processes (sharded, sim metric source) on a real nats-server,
`--workloads` serving workloads announced through the snapshot bucket. Time is compressed
`COMPRESSION` times: a step of 2 s stands for production's 60 s, with history, horizon and
refit cadence scaled alike (20,160 history points, 60 forecast points, a refit every 60
steps), so each forecast does a production forecast's work (query, update with one new
sample, forecast) and refits come as often per forecast as hourly ones do per minute.

* Cost: once every workload is forecast, the processes' CPU time (utime + stime from /proc)
  over `--window` seconds, divided by the forecasts published in it: CPU per forecast, and
  workloads per replica-core at a 1-minute cadence = 60 s / CPU per forecast. The 1-replica
  run is the baseline, measured in the same run; the ratio shows what sharding costs (each
  replica also follows every announcement and renews its membership).
* Hand-over: `--kills` times, one of the 3 replicas is SIGKILLed; per killed replica, the
  time from the kill until each of its workloads is forecast by a survivor (p50 over its
  workloads and the worst), then a fresh replica joins and takes its share again.

Usage: nice -n 10 .venv/bin/python tests/benchmarks/bench_predictor_shards.py
       [--workloads 60] [--model tidal] [--window 120] [--kills 3] [--ttl 3] [--refresh 1]
It asserts nothing; it prints figures.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from tideshift.events import FORECAST, Resources, ServingPolicy, WorkloadChanged, WorkloadRef
from tideshift.services.common.bus import Bus
from tideshift.services.common.embedded_nats import EmbeddedNats
from tideshift.services.predictor.core.shards import owner

TIDESHIFT = str(Path(sys.executable).parent / "tideshift")
STEP_S = 2.0
COMPRESSION = 60.0 / STEP_S
TICKS = os.sysconf("SC_CLK_TCK")
WAIT_S = 300.0


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS  # utime, stime


@dataclass
class Seen:
    """Forecasts received: (time, workload, replica)."""

    forecasts: list[tuple[float, str, str]] = field(default_factory=list)
    arrived: asyncio.Event = field(default_factory=asyncio.Event)

    def add(self, workload: str, source: str) -> None:
        replica = source.split("/")[1].removeprefix("predictor-")
        self.forecasts.append((time.monotonic(), workload, replica))
        self.arrived.set()

    async def until(self, done: Callable[[], bool]) -> None:
        async with asyncio.timeout(WAIT_S):
            while not done():
                self.arrived.clear()
                await self.arrived.wait()

    def by_owner_since(self, since: float) -> dict[str, set[str]]:
        by: dict[str, set[str]] = defaultdict(set)
        for at, workload, replica in self.forecasts:
            if at >= since:
                by[workload].add(replica)
        return by


class Replicas:
    def __init__(self, nats: EmbeddedNats, args: argparse.Namespace, logs: Path) -> None:
        self.env = {
            **os.environ,
            "TIDESHIFT_NATS_URL": nats.url,
            "TIDESHIFT_HEALTH_PORT": "-1",
            "TIDESHIFT_METRIC_SOURCE": "sim",
            "TIDESHIFT_MODEL": args.model,
            "TIDESHIFT_STEP_SECONDS": str(STEP_S),
            "TIDESHIFT_HORIZON_SECONDS": str(3600 / COMPRESSION),
            "TIDESHIFT_HISTORY_SECONDS": str(14 * 86400 / COMPRESSION),
            "TIDESHIFT_REFIT_SECONDS": str(3600 / COMPRESSION),
            "TIDESHIFT_STALE_AFTER_SECONDS": str(180 / COMPRESSION),
            "TIDESHIFT_OBSERVE_SECONDS": "0",
            "TIDESHIFT_SNAPSHOT_BUCKET": "bench_snapshot",
            "TIDESHIFT_SHARDED": "true",
            "TIDESHIFT_MEMBERS_BUCKET": "bench_members",
            "TIDESHIFT_MAX_ANNOUNCED_WORKLOADS": str(args.workloads),
            "TIDESHIFT_LEASE_TTL_SECONDS": str(args.ttl),
            "TIDESHIFT_LEASE_REFRESH_SECONDS": str(args.refresh),
            "TIDESHIFT_LOG_LEVEL": "WARNING",
        }
        self.logs = logs
        self.processes: dict[str, subprocess.Popen[bytes]] = {}
        self.started = 0

    def start(self) -> str:
        name = f"r{self.started}"
        self.started += 1
        with (self.logs / f"{name}.log").open("ab") as log:
            self.processes[name] = subprocess.Popen(
                [TIDESHIFT, "run", "predictor", "--instance", name],
                env=self.env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        return name

    def kill(self, name: str) -> None:
        process = self.processes.pop(name)
        process.send_signal(signal.SIGKILL)
        process.wait(30)

    def stop_all(self) -> None:
        for process in self.processes.values():
            process.terminate()
        for process in self.processes.values():
            try:
                process.wait(30)
            except subprocess.TimeoutExpired:
                process.kill()
        self.processes.clear()

    def cpu(self) -> float:
        return sum(cpu_seconds(p.pid) for p in self.processes.values())


async def announce(bus: Bus, count: int) -> list[str]:
    kv = await bus.kv("bench_snapshot")
    names = []
    for i in range(count):
        event = WorkloadChanged(
            change="added",
            workload=WorkloadRef("bench", "Deployment", f"web-{i}"),
            role="serving",
            replicas=1,
            requests=Resources(cpu=0.1),
            serving=ServingPolicy(capacity_rps=10),
            observed_at=datetime.now(UTC),
        )
        await kv.put(f"workload.bench.{i}", event)
        names.append(str(event.workload))
    return names


async def settled(seen: Seen, workloads: list[str], live: list[str]) -> None:
    """Every workload forecast by its owner among `live` alone for two steps."""

    def done() -> bool:
        by = seen.by_owner_since(time.monotonic() - 2 * STEP_S)
        return all(by.get(w) == {owner(w, live)} for w in workloads)

    await seen.until(done)


async def cost(replicas: Replicas, seen: Seen, window_s: float) -> dict[str, float]:
    # One refit period of warm-up: the first fits are not steady work.
    await asyncio.sleep(3600 / COMPRESSION)
    cpu_before, started = replicas.cpu(), time.monotonic()
    await asyncio.sleep(window_s)
    cpu_used, ended = replicas.cpu() - cpu_before, time.monotonic()
    forecasts = sum(1 for at, _, _ in seen.forecasts if started <= at < ended)
    per_forecast = cpu_used / max(forecasts, 1)
    return {
        "replicas": len(replicas.processes),
        "forecasts": forecasts,
        "cores": cpu_used / (ended - started),
        "cpu_ms_per_forecast": per_forecast * 1000,
        "workloads_per_core": 60.0 / per_forecast if per_forecast else float("inf"),
    }


async def handovers(
    replicas: Replicas, seen: Seen, workloads: list[str], kills: int
) -> list[list[float]]:
    """Per kill, the seconds from the SIGKILL until each of the dead one's workloads is
    forecast by a survivor."""
    taken: list[list[float]] = []
    for _ in range(kills):
        live = sorted(replicas.processes)
        victim = live[0]
        theirs = [w for w in workloads if owner(w, live) == victim]
        replicas.kill(victim)
        killed = time.monotonic()
        survivors = [r for r in live if r != victim]
        await settled(seen, workloads, survivors)
        taken.append(
            [
                min(at for at, wl, r in seen.forecasts if wl == w and at > killed and r != victim)
                - killed
                for w in theirs
            ]
        )
        survivors.append(replicas.start())
        await settled(seen, workloads, sorted(survivors))
    return taken


def spread(seconds: list[float]) -> str:
    return f"p50 {statistics.median(seconds):.2f} s, max {max(seconds):.2f} s"


def show(row: dict[str, float], baseline: dict[str, float]) -> None:
    print(
        f"  {row['replicas']:.0f} replica(s): {row['forecasts']:.0f} forecasts, "
        f"{row['cores']:.3f} cores, {row['cpu_ms_per_forecast']:.2f} ms CPU per forecast, "
        f"{row['workloads_per_core']:,.0f} workloads per replica-core at a 1-min cadence "
        f"({row['cpu_ms_per_forecast'] / baseline['cpu_ms_per_forecast']:.2f}x the 1-replica "
        "cost per forecast)"
    )


async def run(args: argparse.Namespace, logs: Path) -> None:
    with EmbeddedNats() as nats:
        bus = await Bus.connect(nats.url, name="bench-shards")
        await bus.ensure_streams()
        seen = Seen()

        async def listen() -> None:
            async for envelope in bus.subscribe(FORECAST.filter(namespace="bench"), consumer="b"):
                seen.add(str(envelope.data.workload), envelope.source)

        listener = asyncio.create_task(listen())
        replicas = Replicas(nats, args, logs)
        try:
            workloads = await announce(bus, args.workloads)
            print(f"{args.workloads} workloads, model {args.model}, load {os.getloadavg()[0]:.1f}")
            replicas.start()
            await settled(seen, workloads, sorted(replicas.processes))
            one = await cost(replicas, seen, args.window)
            show(one, one)
            replicas.start()
            replicas.start()
            await settled(seen, workloads, sorted(replicas.processes))
            three = await cost(replicas, seen, args.window)
            show(three, one)
            taken = await handovers(replicas, seen, workloads, args.kills)
            print(f"hand-over after a SIGKILL (lease TTL {args.ttl} s, renewal {args.refresh} s):")
            for index, seconds in enumerate(taken, 1):
                print(f"  kill {index}: {len(seconds)} workloads, {spread(seconds)}")
            print(f"  all kills: {spread([s for seconds in taken for s in seconds])}")
            print(f"load {os.getloadavg()[0]:.1f}; logs in {logs}")
        finally:
            replicas.stop_all()
            listener.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await listener
            await bus.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--workloads", type=int, default=60)
    parser.add_argument("--model", default="tidal")
    parser.add_argument("--window", type=float, default=120.0, help="seconds of cost measured")
    parser.add_argument("--kills", type=int, default=3)
    parser.add_argument("--ttl", type=int, default=3, help="lease TTL, whole seconds")
    parser.add_argument("--refresh", type=float, default=1.0, help="lease renewal, seconds")
    args = parser.parse_args()
    asyncio.run(run(args, Path(tempfile.mkdtemp(prefix="bench-shards-"))))


if __name__ == "__main__":
    main()
