"""How long `tideshift explain` takes over a day of decision history, and what the history costs.

Run: .venv/bin/python tests/benchmarks/bench_insight_history.py [--plans 5760] [--targets 50]
(5,760 plans: one every 15 s for a day). A real nats-server (the bundled binary) holds the
history stream as the executor creates it; the plans go in as the planner publishes them (core
NATS), each naming `--targets` targets with their sizing, plus one scale command per plan for
the explained target. Prints the stream's bytes per plan, the time to read the window raw (an
ephemeral consumer, no decoding: the baseline) and the time `explain` takes end to end (read,
decode, fold), with its ratio to the baseline; then, with the watcher's snapshot of `--nodes`
nodes and `--pods` pods written, the time `status` takes against listing the snapshot's keys.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

from tideshift.events import (
    PLAN_DECIDED,
    SCALE_COMMAND,
    SNAPSHOT_BUCKET,
    NodeChanged,
    PlanDecided,
    PodChanged,
    Resources,
    ScaleCommand,
    ServingPolicy,
    TargetDecision,
    WorkloadChanged,
    WorkloadRef,
)
from tideshift.events.models import Headroom
from tideshift.services.common.bus import Bus
from tideshift.services.common.bus.streams import HISTORY_STREAM, read_kept
from tideshift.services.common.embedded_nats import EmbeddedNats
from tideshift.services.executor.service import ExecutorSettings
from tideshift.services.insight import cli
from tideshift.services.watcher.core.snapshot import node_key, pod_key, workload_key

REASON = "forecast q0.95 peak 240.0 req/s over the next 90 s / 10 req/s per replica = 24"
PARTS = Headroom(forecast=240.0, rise=200.0, rise_ratio=1.25, observed=160.0, panic_hold=False)


async def fill(bus: Bus, *, plans: int, targets: int, start: datetime) -> WorkloadRef:
    refs = [WorkloadRef("shop", "Deployment", f"web-{i}") for i in range(targets)]
    explained = refs[0]
    where = {"namespace": "shop", "kind": explained.kind, "name": explained.name}
    for n in range(plans):
        at = start + timedelta(seconds=15 * n)
        plan_id = f"plan-{n}"
        desired = 20 + n % 5  # a change every plan: the worst case for folding
        command = ScaleCommand(
            target=explained, desired=desired, reason=REASON, plan_id=plan_id, issued_at=at,
            idempotency_key=plan_id,
        )  # fmt: skip
        await bus.publish_durable(SCALE_COMMAND.at(**where), command, msg_id=plan_id)
        items = tuple(
            TargetDecision(target=ref, current=20, desired=desired, reason=REASON, headroom=PARTS)
            for ref in refs
        )
        plan = PlanDecided(plan_id=plan_id, policy="tideshift", decided_at=at, targets=items)
        await bus.publish(PLAN_DECIDED.at(policy="tideshift"), plan)
    await bus.flush()
    return explained


async def kept_in_full(bus: Bus, messages: int) -> Any:
    """The stream's info once it holds `messages` (commands arrive through its source)."""
    arrived = asyncio.Event()
    info = None
    while not arrived.is_set():
        info = await bus.js.stream_info(HISTORY_STREAM.name)
        if info.state.messages >= messages:
            arrived.set()
        else:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(arrived.wait(), timeout=0.1)
    return info


def quietly(command: Callable[[list[str]], int], argv: list[str]) -> int:
    with open(os.devnull, "w") as sink, contextlib.redirect_stdout(sink):
        return command(argv)


async def snapshot(bus: Bus, *, nodes: int, pods: int, targets: int) -> None:
    """The watcher's snapshot of a cluster this size (the keys and values it writes)."""
    kv, now = await bus.kv(SNAPSHOT_BUCKET), datetime.now(UTC)
    for n in range(nodes):
        node = NodeChanged(
            change="added", name=f"n{n}", allocatable=Resources(cpu=32), observed_at=now
        )
        await kv.put(node_key(node.name), node)
    owners = [WorkloadRef("shop", "Deployment", f"web-{i}") for i in range(targets)]
    for ref in owners:
        workload = WorkloadChanged(
            change="added", workload=ref, role="serving", replicas=20, requests=Resources(cpu=1),
            serving=ServingPolicy(capacity_rps=10), observed_at=now,
        )  # fmt: skip
        await kv.put(workload_key(ref), workload)
    for p in range(pods):
        pod = PodChanged(
            change="added", namespace="shop", name=f"p{p}", phase="Running", node=f"n{p % nodes}",
            owner=owners[p % targets], role="serving", observed_at=now,
        )  # fmt: skip
        await kv.put(pod_key("shop", pod.name), pod)


async def measure(plans: int, targets: int, *, nodes: int, pods: int) -> None:
    with EmbeddedNats() as server:
        bus = await Bus.connect(server.url, name="bench-insight", max_message_bytes=8 << 20)
        await bus.ensure_streams()
        await bus.ensure_streams((ExecutorSettings().history_stream(),))
        since = datetime.now(UTC) - timedelta(minutes=1)
        started = time.perf_counter()
        target = await fill(bus, plans=plans, targets=targets, start=datetime.now(UTC))
        filled = time.perf_counter() - started
        info = await kept_in_full(bus, 2 * plans)
        filters = (PLAN_DECIDED.filter().value, SCALE_COMMAND.filter().value)
        started = time.perf_counter()
        raw = [
            payload async for _, payload in read_kept(bus.js, HISTORY_STREAM, filters, since=since)
        ]
        baseline = time.perf_counter() - started
        await bus.close()
        argv = [f"deploy/{target.name}", "-n", "shop", "--since", "1d", "--nats-url", server.url]
        started = time.perf_counter()
        # In a thread: the command runs its own event loop.
        code = await asyncio.to_thread(quietly, cli.explain_main, [*argv, "-o", "json"])
        explained = time.perf_counter() - started
        bus = await Bus.connect(server.url, name="bench-insight")
        await snapshot(bus, nodes=nodes, pods=pods, targets=targets)
        started = time.perf_counter()
        keys = await (await bus.kv(SNAPSHOT_BUCKET)).keys()
        listed = time.perf_counter() - started
        await bus.close()
        started = time.perf_counter()
        status_code = await asyncio.to_thread(quietly, cli.status_main, ["--nats-url", server.url])
        pictured = time.perf_counter() - started
    state = info.state
    print(f"plans: {plans} x {targets} targets, published in {filled:.1f} s")
    per_plan = state.bytes / plans / 1024
    print(f"history: {state.messages} messages, {state.bytes / 2**20:.1f} MiB, ", end="")
    print(f"{per_plan:.1f} KiB per plan (with its command's copy)")
    print(f"raw read of {len(raw)} messages: {baseline:.2f} s (baseline)")
    ratio = explained / baseline
    print(f"explain end to end (exit {code}): {explained:.2f} s, {ratio:.1f}x the raw read")
    print(
        f"snapshot: {nodes} nodes, {pods} pods, {targets} workloads; listing its {len(keys)} keys:"
    )
    print(
        f"  {listed:.2f} s (baseline); status end to end (exit {status_code}): {pictured:.2f} s, "
    )
    print(f"  {pictured / listed:.1f}x the listing")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--plans", type=int, default=5760)
    parser.add_argument("--targets", type=int, default=50)
    parser.add_argument("--nodes", type=int, default=200)
    parser.add_argument("--pods", type=int, default=5000)
    args = parser.parse_args()
    asyncio.run(measure(args.plans, args.targets, nodes=args.nodes, pods=args.pods))


if __name__ == "__main__":
    main()
