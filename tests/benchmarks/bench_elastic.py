"""Elastic training figures on the Paddle CTR example: throughput, goodput under churn, join
and leave latency, pserver gradient throughput against raw NATS request/reply.

Run: `.venv/bin/python tests/benchmarks/bench_elastic.py [--quick]`. Starts its own
nats-server, pservers, coordinator and `examples/training/paddle_ctr/ctr.py` trainers.

* samples/s with 1, 2 and 4 trainers: applied batches x batch size over a window, measured
  once every trainer has applied its first batch (the job has open-ended epochs);
* churn: starting from 2 trainers, every --churn-every seconds one is SIGTERMed, then one
  added, then another added (2, 1, 2, 3 trainers: a time-weighted mean of 2); goodput =
  samples/s under churn / steady samples/s with 2 trainers, both measured in this run;
* goodput (b), the worst case: the churn above; from process start (what the run measured)
  and from SDK connect (each join's process start -> SDK connect, Python and Paddle imports
  that a cluster's image and scheduler charge anyway, given back);
* goodput (a), at the planner's real churn: trainer changes per job-hour from
  `tideshift simulate --json` (policy tideshift) on loadgen/scenarios/*.yaml, charged the
  seconds of training each change cost in (b): 1 - changes/h x lost s per change / 3600;
* join latency: trainer process start -> its first applied batch (from its log);
* leave latency: SIGTERM -> process exit;
* gradient MB/s: dense pushes through the pserver (chunked, applied with SGD) against raw
  NATS request/reply of the same bytes in messages of the same size and concurrency.
Prints figures; asserts nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from datetime import datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "integration" / "trainer"))

import numpy as np
from trainer_harness import REPO, JobHarness, ServiceProcess, applied_total, client_of, wait_until

from tideshift.services.common.bus import Bus
from tideshift.services.common.embedded_nats import EmbeddedNats
from tideshift.services.trainer.model import DatasetSpec, ModelSpec, dataset_uris
from tideshift.services.trainer.pserver_client import PARTS_IN_FLIGHT, PServerClient
from tideshift.services.trainer.sdk import ElasticJob

SCRIPT = REPO / "examples" / "training" / "paddle_ctr" / "ctr.py"
DATA = DatasetSpec(
    seed=7,
    num_shards=64,
    samples_per_shard=2000,
    holdout_samples=1000,
    batch_size=250,
    model=ModelSpec(num_buckets=4096),
)


def logged_at(trainer: ServiceProcess, what: str) -> float | None:
    """Wall-clock time of the trainer's first log line containing `what`."""
    for line in trainer.stderr_path.read_text().splitlines():
        stamp = re.search(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}", line)
        if what in line and stamp is not None:
            return datetime.strptime(stamp.group(), "%Y-%m-%d %H:%M:%S,%f").timestamp()
    return None


def simulated_churn() -> dict[str, float]:
    """Trainer changes per job-hour the tideshift policy makes, per shipped scenario with
    training jobs (`trainer_churn` over the jobs' summed completion times)."""
    rates = {}
    for scenario in sorted((REPO / "loadgen" / "scenarios").glob("*.yaml")):
        result = subprocess.run(
            [sys.executable, "-m", "tideshift.services.cli", "simulate", "--scenario",
             str(scenario), "--policy", "tideshift", "--json"],
            cwd=REPO, capture_output=True, text=True, timeout=900, check=True,
        )  # fmt: skip
        policy = json.loads(result.stdout)["policies"]["tideshift"]
        jobs = policy.get("jobs", {})
        job_hours = jobs.get("finished", 0) * jobs.get("jct_s", {}).get("mean", 0.0) / 3600
        if job_hours > 0:
            rates[scenario.stem] = policy["trainer_churn"] / job_hours
    return rates


def first_batch_at(trainer: ServiceProcess) -> float | None:
    return logged_at(trainer, "applied its first batch")


class Job:
    def __init__(self, server: EmbeddedNats, bus: Bus, workdir: Path, label: str) -> None:
        self.harness = JobHarness(
            server.url,
            f"bench-{label}-{uuid.uuid4().hex[:6]}",
            workdir / label,
            coordinator_args=[
                "--dataset", json.dumps(dataset_uris(DATA)), "--pservers", "2",
                "--optimizer", '{"kind": "adagrad", "learning_rate": 0.1}',
            ],
        )  # fmt: skip
        (workdir / label).mkdir(parents=True)
        self.bus = bus
        self.trainers: list[ServiceProcess] = []
        self.started_at: dict[str, float] = {}
        self.client: PServerClient | None = None

    async def start(self, trainers: int) -> None:
        self.harness.pserver(0).start()
        self.harness.pserver(1).start()
        self.harness.coordinator().start()
        for _ in range(trainers):
            self.add()
        self.client = await client_of(self.bus, self.harness.job)

    def add(self) -> ServiceProcess:
        name = f"t{len(self.trainers) + 1}"
        self.started_at[name] = time.time()
        trainer = self.harness.script(name, SCRIPT, ["--grace-seconds", "10"]).start()
        self.trainers.append(trainer)
        return trainer

    async def remove(self) -> float:
        """SIGTERM the oldest live trainer; seconds until it exited."""
        trainer = next(t for t in self.trainers if t.running)
        started = time.monotonic()
        await trainer.terminate(timeout=30)
        return time.monotonic() - started

    async def all_joined(self) -> None:
        async def joined() -> bool:
            return all(first_batch_at(t) is not None for t in self.trainers if t.running)

        await wait_until(joined, timeout=120, what="every trainer's first batch", every=0.2)

    async def applied(self) -> int:
        assert self.client is not None
        counts: list[int] = []

        async def answered() -> bool:
            count = await applied_total(self.client)  # type: ignore[arg-type]
            counts.extend([] if count is None else [count])
            return bool(counts)

        await wait_until(answered, timeout=30, what="the pservers' counts")
        return counts[0]

    def join_latencies(self) -> list[tuple[float, float]]:
        """(process start -> first applied batch, connected -> first applied batch) each."""
        return [
            (at - self.started_at[t.name], at - connected)
            for t in self.trainers
            if (at := first_batch_at(t)) is not None
            and (connected := logged_at(t, "joined")) is not None
        ]

    async def stop(self) -> None:
        await self.harness.stop_all()
        self.harness.kill_all()


async def steady(server: EmbeddedNats, bus: Bus, workdir: Path, trainers: int, window: float):
    job = Job(server, bus, workdir, f"steady{trainers}")
    try:
        await job.start(trainers)
        await job.all_joined()
        before, started = await job.applied(), time.monotonic()
        await asyncio.sleep(window)
        rate = (await job.applied() - before) * DATA.batch_size / (time.monotonic() - started)
        return rate, job.join_latencies(), [await job.remove() for _ in range(trainers)]
    finally:
        await job.stop()


async def churn(server: EmbeddedNats, bus: Bus, workdir: Path, every: float):
    job = Job(server, bus, workdir, "churn")
    try:
        await job.start(2)
        await job.all_joined()
        before, started = await job.applied(), time.monotonic()
        leaves = []
        for step in ("remove", "add", "add", "hold"):
            if step == "remove":
                leaves.append(await job.remove())
            elif step == "add":
                job.add()
            await asyncio.sleep(max(0.0, every - (time.monotonic() - started) % every))
        elapsed = time.monotonic() - started
        rate = (await job.applied() - before) * DATA.batch_size / elapsed
        await job.all_joined()
        return rate, job.join_latencies(), leaves
    finally:
        await job.stop()


async def raw_requests(bus: Bus, subject: str, payload: bytes, megabytes: int) -> None:
    """`megabytes` of requests of `payload`'s size, as many in flight as a push sends."""
    in_flight = asyncio.Semaphore(PARTS_IN_FLIGHT)

    async def one() -> None:
        async with in_flight:
            await bus.request(subject, payload)

    await asyncio.gather(*(one() for _ in range(megabytes * 1024 * 1024 // len(payload))))


def gradient_throughput(server: EmbeddedNats, workdir: Path, megabytes: list[int]) -> list[str]:
    """Dense pushes through one pserver vs raw request/reply of the same bytes and sizes."""
    harness = JobHarness(
        server.url,
        f"bench-push-{uuid.uuid4().hex[:6]}",
        workdir,
        coordinator_args=["--dataset", '["x"]', "--optimizer", '{"kind": "sgd"}'],
    )
    lines = []
    workdir.mkdir(parents=True)
    try:
        harness.pserver().start()
        harness.coordinator().start()
        job = ElasticJob.connect(harness.job, nats_url=server.url, handle_sigterm=False)
        shapes = {f"w{mb}": (mb * 1024 * 1024 // (256 * 4), 256) for mb in megabytes}
        job.initialize({name: np.zeros(shape, dtype=np.float32) for name, shape in shapes.items()})
        client = job._require_client()
        loop = job._loop
        chunk = job.spec.max_piece_bytes

        async def echo_server() -> object:
            return await job.bus.serve(f"bench.echo.{harness.job}", echo)

        async def echo(_: bytes) -> bytes:
            return b"ok"

        stop_echo = loop.run(echo_server())
        batches = iter(range(10**6))  # the pserver applies one shard's batches in order
        for mb in megabytes:
            part = {f"w{mb}": np.ones(shapes[f"w{mb}"], dtype=np.float32)}
            pushes = []
            for _ in range(3):
                started = time.perf_counter()
                index = next(batches)
                push = client.push(
                    part, push_id=f"b{index}", epoch=0, shard=0, batch=index, last=False
                )
                loop.run(push)
                pushes.append(time.perf_counter() - started)
            raw = []
            payload = bytes(chunk)
            for _ in range(3):
                started = time.perf_counter()
                loop.run(raw_requests(job.bus, f"bench.echo.{harness.job}", payload, mb))
                raw.append(time.perf_counter() - started)
            push_rate, raw_rate = mb / statistics.median(pushes), mb / statistics.median(raw)
            lines.append(
                f"  {mb:3d} MB gradient: pserver {push_rate:7.1f} MB/s, raw NATS "
                f"request/reply {raw_rate:7.1f} MB/s ({push_rate / raw_rate:.0%})"
            )
        loop.run(stop_echo())  # type: ignore[operator]
        job.close()
    finally:
        asyncio.run(harness.stop_all())
        harness.kill_all()
    return lines


def p99(values: list[float]) -> float:
    return float(np.percentile(values, 99)) if values else float("nan")


async def run(args: argparse.Namespace) -> None:
    server = EmbeddedNats()
    server.start()
    bus = await Bus.connect(server.url, name="bench")
    workdir = Path(tempfile.mkdtemp(prefix="bench-elastic-"))
    try:
        rates: dict[int, float] = {}
        joins: list[tuple[float, float]] = []
        leaves: list[float] = []
        for trainers in (1, 2, 4):
            rates[trainers], join, leave = await steady(server, bus, workdir, trainers, args.window)
            joins += join
            leaves += leave
            print(f"steady {trainers} trainer(s): {rates[trainers]:8.0f} samples/s", flush=True)
        churn_rate, join, leave = await churn(server, bus, workdir, args.churn_every)
        joins += join
        leaves += leave
        goodput_start = churn_rate / rates[2]
        # 3 changes (a leave, two joins); each join's imports given back for "from connect".
        imports = statistics.mean(start - sdk for start, sdk in join) if join else 0.0
        lost_start = (1 - goodput_start) * args.churn_every
        lost_connect = max(0.0, lost_start - imports * 2 / 3)
        goodput_connect = 1 - lost_connect / args.churn_every
        print(
            f"goodput (b), 2,1,2,3 trainers, a change every {args.churn_every:.0f}s: "
            f"{churn_rate:8.0f} samples/s; vs steady 2 from process start {goodput_start:.0%}, "
            f"from SDK connect {goodput_connect:.0%} (lost per change {lost_start:.1f}s / "
            f"{lost_connect:.1f}s; process start -> SDK connect {imports:.1f}s per join)"
        )
        for scenario, per_hour in simulated_churn().items():
            print(
                f"goodput (a), {scenario}: {per_hour:.1f} trainer changes per job-hour "
                f"(one every {3600 / per_hour:.0f}s): from process start "
                f"{1 - per_hour * lost_start / 3600:.1%}, from SDK connect "
                f"{1 - per_hour * lost_connect / 3600:.1%} of steady"
            )
        print(
            f"scaling: 2 trainers {rates[2] / rates[1]:.2f}x, "
            f"4 trainers {rates[4] / rates[1]:.2f}x of one"
        )
        for label, values in (
            ("process start", [start for start, _ in joins]),
            ("SDK connected (after Python and Paddle imports)", [sdk for _, sdk in joins]),
        ):
            print(
                f"join latency, {label} -> first applied batch: p50 "
                f"{statistics.median(values):.2f}s, p99 {p99(values):.2f}s over {len(values)} joins"
            )
        print(
            f"leave latency (SIGTERM -> exit): p50 {statistics.median(leaves):.2f}s, "
            f"max {max(leaves):.2f}s over {len(leaves)} leaves (grace 10s)"
        )
        print(
            "gradient throughput (dense float32, applied with SGD, in 256 KiB parts; median of 3):"
        )
        lines = await asyncio.to_thread(
            gradient_throughput, server, workdir / "push", [1, 8] if args.quick else [1, 8, 32]
        )
        print("\n".join(lines))
    finally:
        await bus.close()
        server.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="10 s windows, 1 and 8 MB pushes")
    parser.add_argument("--window", type=float, default=30.0, help="steady measuring window (s)")
    parser.add_argument("--churn-every", type=float, default=20.0, help="seconds between changes")
    args = parser.parse_args()
    if args.quick:
        args.window = 10.0
    asyncio.run(run(args))


if __name__ == "__main__":
    main()
