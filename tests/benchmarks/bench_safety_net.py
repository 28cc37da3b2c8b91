"""Benchmark: how soon the planner service sizes serving for demand above its plan.

Runs nats-server and the planner service in this process (tick 600 s, so every plan here is
triggered by an event), with one big node and `--samples` x 2 serving workloads, each first
planned from a forecast of 100 req/s. Prints p50/p99 of:

(a) a `DemandObserved` of 1,000 req/s for a workload, published on NATS -> the `PlanDecided`
    that sizes that workload for it (the safety net: plans at once on the observation);
(b) baseline, same run, interleaved with (a): a forecast of 1,000 req/s for another workload
    -> the `PlanDecided` sizing it (the forecast path, which also plans on the leading edge).

Usage: .venv/bin/python tests/benchmarks/bench_safety_net.py [--samples 30]
It asserts nothing about time; it prints figures.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from tests.benchmarks.bench_watch_scale import percentile, summary  # noqa: E402
from tideshift.events import (  # noqa: E402
    DEMAND_OBSERVED,
    FORECAST,
    NODE_CHANGED,
    PLAN_DECIDED,
    DemandObserved,
    ForecastIssued,
    ForecastPoint,
    NodeChanged,
    PlanDecided,
    Resources,
    WorkloadRef,
)
from tideshift.services.common.bus import Bus  # noqa: E402
from tideshift.services.common.embedded_nats import EmbeddedNats  # noqa: E402
from tideshift.services.planner.service import Planner  # noqa: E402
from tideshift.services.planner.settings import PlannerSettings, ServingTarget  # noqa: E402

NAMESPACE = "bench"
CAPACITY_RPS = 100.0
LOW_RPS, HIGH_RPS = 100.0, 1000.0
NEEDED = int(HIGH_RPS / CAPACITY_RPS)
WAIT_S = 30.0


def forecast(name: str, rps: float) -> ForecastIssued:
    now = datetime.now(UTC)
    return ForecastIssued(
        workload=WorkloadRef(NAMESPACE, "Deployment.apps", name),
        issued_at=now,
        step_seconds=60,
        model="bench",
        points=tuple(
            ForecastPoint(
                at=now + timedelta(seconds=60 * k), point=rps, q50=rps, q90=rps, q95=rps, q99=rps
            )
            for k in range(10)
        ),
    )


class Plans:
    """The latest desired replicas per workload, from PlanDecided events."""

    def __init__(self) -> None:
        self.desired: dict[str, int] = {}
        self.arrived = asyncio.Event()

    async def follow(self, bus: Bus) -> None:
        async for envelope in bus.subscribe(PLAN_DECIDED.filter(), consumer="bench-plans"):
            plan: PlanDecided = envelope.data
            for item in plan.targets:
                self.desired[item.target.name] = item.desired
            self.arrived.set()

    async def until(self, name: str, at_least: int) -> None:
        deadline = time.monotonic() + WAIT_S
        while self.desired.get(name, 0) < at_least:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(f"{name} never planned to {at_least}")
            self.arrived.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.arrived.wait(), remaining)


async def run(samples: int) -> None:
    nats = EmbeddedNats()
    nats.start()
    names = [f"obs-{i}" for i in range(samples)] + [f"fc-{i}" for i in range(samples)]
    settings = PlannerSettings(
        serving=[
            ServingTarget(
                namespace=NAMESPACE, name=name, cpu=0.1, capacity_rps=CAPACITY_RPS, max_replicas=50
            )
            for name in names
        ],
        tick_seconds=600.0,
        health_port=-1,
    )
    bus = await Bus.connect(nats.url, name="bench")
    await bus.ensure_streams()
    plans = Plans()
    follower = asyncio.create_task(plans.follow(bus))
    planner = Planner(bus, settings, "bench", asyncio.Event())
    service = asyncio.create_task(planner.run())
    observed: list[float] = []
    forecasted: list[float] = []
    try:
        await asyncio.wait_for(planner.ready.wait(), 30)
        node = NodeChanged(
            change="added",
            name="big",
            allocatable=Resources(cpu=10_000.0, memory=2**50),
            observed_at=datetime.now(UTC),
        )
        await bus.publish(NODE_CHANGED.at(name="big"), node)
        for name in names:
            await bus.publish(FORECAST.at(namespace=NAMESPACE, workload=name), forecast(name, 100))
        await plans.until(names[-1], int(LOW_RPS / CAPACITY_RPS))
        for i in range(samples):
            name = f"obs-{i}"
            event = DemandObserved(
                workload=WorkloadRef(NAMESPACE, "Deployment.apps", name),
                rps=HIGH_RPS,
                observed_at=datetime.now(UTC),
            )
            started = time.perf_counter()
            await bus.publish(DEMAND_OBSERVED.at(namespace=NAMESPACE, workload=name), event)
            await plans.until(name, NEEDED)
            observed.append(time.perf_counter() - started)
            name = f"fc-{i}"
            started = time.perf_counter()
            await bus.publish(
                FORECAST.at(namespace=NAMESPACE, workload=name), forecast(name, HIGH_RPS)
            )
            await plans.until(name, NEEDED)
            forecasted.append(time.perf_counter() - started)
    finally:
        planner.stopping.set()
        await asyncio.wait_for(service, 30)
        follower.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await follower
        await bus.close()
        nats.stop()
    print(summary("(a) observed demand above the plan -> plan sizing for it", observed))
    print(summary("(b) baseline: forecast jump -> plan sizing for it", forecasted))
    for q in (50, 99):
        print(f"    p{q} ratio (a)/(b): {percentile(observed, q) / percentile(forecasted, q):.2f}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=30, help="samples of each (default 30)")
    args = parser.parse_args()
    load = ", ".join(f"{value:.1f}" for value in os.getloadavg())
    print(f"machine: {os.cpu_count()} cores, load average {load}; python {sys.version.split()[0]}")
    asyncio.run(run(args.samples))
    return 0


if __name__ == "__main__":
    sys.exit(main())
