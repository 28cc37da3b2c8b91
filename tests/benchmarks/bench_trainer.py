"""Trainer throughput: samples/s with 1, 2 and 4 trainer processes, then under churn.

Run: `.venv/bin/python tests/benchmarks/bench_trainer.py [--window 20] [--churn-every 20]`.
Starts its own nats-server. Each run is one job with open-ended epochs; throughput is the
growth of the pserver's applied count over a measuring window, after a warm-up in which every
trainer has loaded its shards. The churn run starts with `--churn-trainers` (2) trainers and
every `--churn-every` seconds alternately removes one (SIGTERM, then SIGKILL the next time) or
adds one. Its throughput is compared with the steady run at that count and with the steady
runs weighted by the time spent at each count. Work lost per removal = shards computed again
(applied after a redelivery, or pushed again after being applied) divided by removals.
Prints figures; asserts nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "integration" / "trainer"))
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from trainer_harness import JobHarness, wait_until

from tideshift.services.common.bus import Bus, RequestFailed
from tideshift.services.common.embedded_nats import EmbeddedNats
from tideshift.services.trainer.jobs import read_spec
from tideshift.services.trainer.pserver_client import PServerClient, PServerStatus

SHARDS = 32
SAMPLES_PER_SHARD = 25_000


def job_args(data_dir: Path) -> list[str]:
    return [
        "--shards", str(SHARDS), "--samples-per-shard", str(SAMPLES_PER_SHARD),
        "--holdout-samples", "5000", "--data-dir", str(data_dir), "--ack-wait-seconds", "5",
    ]  # fmt: skip


async def status(client: PServerClient) -> PServerStatus | None:
    try:
        (result,) = await client.status(from_epoch=0)
    except RequestFailed:
        return None
    return result


async def start_job(
    bus: Bus, server: EmbeddedNats, workdir: Path, data_dir: Path, trainers: int, label: str
) -> tuple[JobHarness, PServerClient]:
    harness = JobHarness(
        server.url,
        f"bench-{label}-{uuid.uuid4().hex[:6]}",
        workdir / label,
        coordinator_args=job_args(data_dir),
    )
    harness.log_dir.mkdir(parents=True, exist_ok=True)
    harness.pserver().start()
    harness.coordinator().start()
    for index in range(trainers):
        harness.trainer(f"t{index + 1}").start()
    spec = None

    async def spec_ready() -> bool:
        nonlocal spec
        spec = await read_spec(bus, harness.job)
        return spec is not None

    await wait_until(spec_ready, timeout=120, what="job spec")
    assert spec is not None
    client = PServerClient(bus, spec, timeout=5.0)

    async def warmed_up() -> bool:
        current = await status(client)
        return current is not None and current.applied_total >= 2 * SHARDS

    await wait_until(warmed_up, timeout=300, what="warm-up", every=0.25)
    return harness, client


async def applied_and_redone(client: PServerClient) -> tuple[int, int]:
    current: PServerStatus | None = None

    async def answered() -> bool:
        nonlocal current
        current = await status(client)
        return current is not None

    await wait_until(answered, timeout=60, what="pserver status")
    assert current is not None
    # Work done twice: a redelivered task that got applied, or a gradient pushed again for a
    # shard already applied (the trainer died between push and ack).
    return current.applied_total, current.redelivered + current.duplicates


async def steady(
    bus: Bus, server: EmbeddedNats, workdir: Path, data_dir: Path, trainers: int, window: float
) -> float:
    harness, client = await start_job(bus, server, workdir, data_dir, trainers, f"steady{trainers}")
    try:
        applied0, _ = await applied_and_redone(client)
        started = time.monotonic()
        await asyncio.sleep(window)
        applied1, _ = await applied_and_redone(client)
        elapsed = time.monotonic() - started
    finally:
        await harness.stop_all()
        harness.kill_all()
    return (applied1 - applied0) * SAMPLES_PER_SHARD / elapsed


async def churn(
    bus: Bus,
    server: EmbeddedNats,
    workdir: Path,
    data_dir: Path,
    *,
    base: int,
    every: float,
    events: int,
) -> dict[str, object]:
    harness, client = await start_job(bus, server, workdir, data_dir, base, f"churn{base}")
    seconds_at: dict[int, float] = {}
    removals = {"SIGTERM": 0, "SIGKILL": 0}
    lost = {"SIGTERM": 0, "SIGKILL": 0}
    next_name = base + 1
    try:
        applied0, redelivered0 = await applied_and_redone(client)
        started = time.monotonic()
        for event in range(events):
            count = len(harness.live_trainers())
            await asyncio.sleep(every)
            seconds_at[count] = seconds_at.get(count, 0.0) + every
            if event % 2 == 0:
                kind = "SIGTERM" if event % 4 == 0 else "SIGKILL"
                victim = harness.live_trainers()[0]
                _, before = await applied_and_redone(client)
                if kind == "SIGTERM":
                    await victim.terminate()
                else:
                    await victim.kill()
                removals[kind] += 1
                # Lost work shows up once the ack wait (5 s) has passed and it was redone.
                await asyncio.sleep(9.0)
                _, after = await applied_and_redone(client)
                lost[kind] += after - before
                seconds_at[count - 1] = seconds_at.get(count - 1, 0.0) + 9.0
            else:
                harness.trainer(f"t{next_name}").start()
                next_name += 1
        applied1, redelivered1 = await applied_and_redone(client)
        elapsed = time.monotonic() - started
    finally:
        await harness.stop_all()
        harness.kill_all()
    return {
        "samples_per_second": (applied1 - applied0) * SAMPLES_PER_SHARD / elapsed,
        "elapsed": elapsed,
        "seconds_at": seconds_at,
        "lost_per_sigterm": lost["SIGTERM"] / max(1, removals["SIGTERM"]),
        "lost_per_sigkill": lost["SIGKILL"] / max(1, removals["SIGKILL"]),
        "redone": float(redelivered1 - redelivered0),
        "removals": float(sum(removals.values())),
    }


async def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--window", type=float, default=20.0, help="steady measuring window, s")
    parser.add_argument("--churn-every", type=float, default=20.0, help="seconds between changes")
    parser.add_argument("--churn-events", type=int, default=4, help="removals + additions")
    parser.add_argument("--churn-trainers", type=int, default=2, help="trainers before churn")
    parser.add_argument("--trainers", default="1,2,4", help="steady trainer counts")
    args = parser.parse_args(argv)
    if args.churn_trainers < 2:
        parser.error("--churn-trainers: expected >= 2 (one is removed)")
    base = args.churn_trainers
    counts = sorted({int(n) for n in args.trainers.split(",")} | {base - 1, base})
    workdir = Path(tempfile.mkdtemp(prefix="tideshift-bench-trainer-"))
    data_dir = workdir / "data"
    with EmbeddedNats() as server:
        bus = await Bus.connect(server.url, name="bench")
        await bus.ensure_streams()
        try:
            rates = {
                n: await steady(bus, server, workdir, data_dir, n, args.window) for n in counts
            }
            for n, rate in rates.items():
                speedup = rate / rates[counts[0]]
                print(f"steady  {n} trainer(s): {rate:12,.0f} samples/s  ({speedup:.2f}x)")
            result = await churn(
                bus,
                server,
                workdir,
                data_dir,
                base=base,
                every=args.churn_every,
                events=args.churn_events,
            )
        finally:
            await bus.close()
    seconds_at: dict[int, float] = result["seconds_at"]  # type: ignore[assignment]
    expected = sum(seconds * rates[n] for n, seconds in seconds_at.items()) / sum(
        seconds_at.values()
    )
    churn_rate = float(result["samples_per_second"])  # type: ignore[arg-type]
    print(
        f"churn ({base} trainers, one removed/added every {args.churn_every:.0f}s): "
        f"{churn_rate:12,.0f} samples/s"
    )
    print(f"  vs steady {base} trainers:                  {churn_rate / rates[base]:.1%}")
    print(f"  vs time-weighted steady ({base - 1} and {base}):     {churn_rate / expected:.1%}")
    print(f"  shards lost per SIGTERM removal:       {result['lost_per_sigterm']:.2f}")
    print(f"  shards lost per SIGKILL removal:       {result['lost_per_sigkill']:.2f}")
    print(json.dumps({"steady": rates, "churn": result, "logs": str(workdir)}))
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main(sys.argv[1:])))
