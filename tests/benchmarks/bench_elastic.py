"""Elastic training figures on the Paddle CTR example: throughput, goodput under churn, join
and leave latency, pserver gradient throughput against raw NATS request/reply.

Run: `.venv/bin/python tests/benchmarks/bench_elastic.py [--quick] [--per-hour N |
--simulated FILE...]`. Starts its own nats-server, pservers, coordinator and
`examples/training/paddle_ctr/ctr.py` trainers.

* samples/s with 1, 2, 3 and 4 trainers: applied batches x batch size over a window, measured
  once every trainer has applied its first batch (the job has open-ended epochs);
* churn: from 2 trainers, one change per interval: one SIGTERMed, one added, another added,
  one SIGTERMed (1, 2, 3, 2 trainers: a time-weighted mean of 2); goodput = samples/s under
  churn / the same time-weighted mean of steady rates, (r1 + 2 r2 + r3) / 4, measured in the
  same job just before (3 and 2 trainers) and after (1) the churn, since other load on a
  shared machine moves rates by tens of % within minutes. Each churn runs twice: joins as
  new processes (from process start: Python and Paddle imports, model build, SDK connect)
  and as warm standby processes (`TIDESHIFT_STANDBY=1`, started before the window, joined
  by SIGUSR1: from SDK attach);
* goodput (a): a change every 3600 / N s, N the trainer changes per job-hour the planner
  makes in `tideshift simulate` (--per-hour, or computed from `simulate --json` outputs
  given with --simulated as trainer_churn / (jobs.total x jobs.jct_s.mean), the highest);
* goodput (b), the worst case: a change every --churn-every (20) s;
* join latency: process start (cold) or SIGUSR1 (warm) -> the trainer's first applied batch;
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
import signal
import statistics
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
from tideshift.services.trainer.core.model import DatasetSpec, ModelSpec, dataset_uris
from tideshift.services.trainer.port.pserver_client import PARTS_IN_FLIGHT, PServerClient
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


def simulated_rates(paths: list[Path]) -> dict[str, float]:
    """Trainer changes per job-hour in `tideshift simulate --json` outputs (policy tideshift):
    trainer pods started and stopped over the jobs' summed time (unfinished jobs count to
    the end of the simulation)."""
    rates = {}
    for path in paths:
        policy = json.loads(path.read_text())["policies"]["tideshift"]
        jobs = policy["jobs"]
        job_hours = jobs["total"] * jobs["jct_s"]["mean"] / 3600
        if job_hours > 0:
            rates[path.name] = policy["trainer_churn"] / job_hours
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
        self.trainers: list[ServiceProcess] = []  # joined (or joining) trainers
        self.standbys: list[ServiceProcess] = []  # warm, not joined yet
        self.started_at: dict[str, float] = {}  # process start (cold) or SIGUSR1 (warm)
        self.client: PServerClient | None = None

    async def start(self, trainers: int) -> None:
        self.harness.pserver(0).start()
        self.harness.pserver(1).start()
        self.harness.coordinator().start()
        for _ in range(trainers):
            self.add()
        self.client = await client_of(self.bus, self.harness.job)

    def _process(self, standby: bool) -> ServiceProcess:
        name = f"t{len(self.trainers) + len(self.standbys) + 1}"
        trainer = self.harness.script(name, SCRIPT, ["--grace-seconds", "10"])
        trainer.env["TIDESHIFT_STANDBY"] = "1" if standby else "0"
        return trainer

    def add(self) -> ServiceProcess:
        """A new trainer process: joins after its imports and connect (a cold join)."""
        trainer = self._process(standby=False)
        self.started_at[trainer.name] = time.time()
        self.trainers.append(trainer.start())
        return trainer

    async def prepare_standbys(self, count: int) -> None:
        """Warm standby processes: imported, connected and initialised, not joined."""
        started = []
        for _ in range(count):  # one at a time: each name counts the ones before it
            started.append(self._process(standby=True).start())
            self.standbys.append(started[-1])

        async def ready() -> bool:
            return all(logged_at(t, "standing by") is not None for t in started)

        await wait_until(ready, timeout=180, what="the warm standbys", every=0.2)

    def attach(self) -> ServiceProcess:
        """Join a warm standby (SIGUSR1)."""
        trainer = self.standbys.pop(0)
        self.started_at[trainer.name] = time.time()
        trainer.signal(signal.SIGUSR1)
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

        await wait_until(joined, timeout=180, what="every trainer's first batch", every=0.2)

    async def applied(self) -> int:
        client = self.client
        assert client is not None
        counts: list[int] = []

        async def answered() -> bool:
            count = await applied_total(client)
            counts.extend([] if count is None else [count])
            return bool(counts)

        await wait_until(answered, timeout=30, what="the pservers' counts")
        return counts[0]

    async def measure(self, window: float) -> float:
        """Samples/s applied over the next `window` seconds."""
        before, started = await self.applied(), time.monotonic()
        await asyncio.sleep(window)
        return (await self.applied() - before) * DATA.batch_size / (time.monotonic() - started)

    def join_latencies(self, skip: int = 0) -> list[tuple[float, float]]:
        """(start or SIGUSR1 -> first applied batch, start or SIGUSR1 -> SDK joined) of each
        trainer after the first `skip`."""
        return [
            (at - self.started_at[t.name], joined - self.started_at[t.name])
            for t in self.trainers[skip:]
            if (at := first_batch_at(t)) is not None and (joined := logged_at(t, "joined"))
        ]

    async def stop(self) -> None:
        await self.harness.stop_all()
        self.harness.kill_all()


Figures = tuple[float, list[tuple[float, float]], list[float]]  # samples/s, joins, leaves


async def steady(
    server: EmbeddedNats, bus: Bus, workdir: Path, trainers: int, window: float
) -> Figures:
    job = Job(server, bus, workdir, f"steady{trainers}")
    try:
        await job.start(trainers)
        await job.all_joined()
        rate = await job.measure(window)
        return rate, job.join_latencies(), [await job.remove() for _ in range(trainers)]
    finally:
        await job.stop()


# One change per interval from 2 trainers: 1, 2, 3, 2 trainers, a time-weighted mean of 2.
PATTERN = ("remove", "join", "join", "remove")


async def churn(
    server: EmbeddedNats, bus: Bus, workdir: Path, every: float, *, warm: bool, window: float
) -> tuple[float, float, list[tuple[float, float]], list[float]]:
    """(samples/s over len(PATTERN) intervals of `every` s, the same job's steady rate for
    the same trainer counts measured just before and after, the joins' latencies, the
    leaves'); joins are new processes, or warm standbys when `warm`. The steady rates are
    taken next to the churn because other load on the machine moves them by tens of %."""
    job = Job(server, bus, workdir, f"churn-{'warm' if warm else 'cold'}-{every:.0f}s")
    try:
        await job.start(3)
        if warm:
            await job.prepare_standbys(PATTERN.count("join"))
        await job.all_joined()
        rates = {3: await job.measure(window)}
        leaves = [await job.remove()]
        rates[2] = await job.measure(window)
        initial = len(job.trainers)
        before, started = await job.applied(), time.monotonic()
        for step, change in enumerate(PATTERN):
            if change == "remove":
                leaves.append(await job.remove())
            elif warm:
                job.attach()
            else:
                job.add()
            await asyncio.sleep(max(0.0, (step + 1) * every - (time.monotonic() - started)))
        elapsed = time.monotonic() - started
        rate = (await job.applied() - before) * DATA.batch_size / elapsed
        await job.all_joined()
        leaves.append(await job.remove())
        rates[1] = await job.measure(window)
        baseline = (rates[1] + 2 * rates[2] + rates[3]) / 4
        return rate, baseline, job.join_latencies(skip=initial), leaves
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


def latency_line(label: str, values: list[float]) -> str:
    if not values:
        return f"{label}: no joins measured"
    return (
        f"{label}: p50 {statistics.median(values):.2f}s, p99 {p99(values):.2f}s, "
        f"max {max(values):.2f}s over {len(values)}"
    )


async def goodput(
    server: EmbeddedNats, bus: Bus, workdir: Path, every: float, window: float, label: str
) -> list[float]:
    """Both churns at one change every `every` s; prints them; returns the leave latencies."""
    leaves: list[float] = []
    for warm in (False, True):
        rate, baseline, joins, leave = await churn(
            server, bus, workdir, every, warm=warm, window=window
        )
        leaves += leave
        clock = "from SDK attach (warm standby)" if warm else "from process start"
        print(
            f"goodput {label}, a change every {every:.0f}s ({3600 / every:.0f} per job-hour), "
            f"joins {clock}: {rate:7.0f} samples/s vs {baseline:7.0f} steady "
            f"= {rate / baseline:.1%}",
            flush=True,
        )
        start = "SIGUSR1" if warm else "process start"
        print("  " + latency_line(f"join, {start} -> first applied batch", [a for a, _ in joins]))
        print("  " + latency_line(f"join, {start} -> SDK joined", [j for _, j in joins]))
    return leaves


async def run(args: argparse.Namespace) -> None:
    rates_per_hour = simulated_rates(args.simulated)
    for name, per_hour in rates_per_hour.items():
        print(f"simulate {name}: {per_hour:.1f} trainer changes per job-hour")
    per_hour = max(rates_per_hour.values(), default=args.per_hour)
    server = EmbeddedNats()
    server.start()
    bus = await Bus.connect(server.url, name="bench")
    workdir = Path(tempfile.mkdtemp(prefix="bench-elastic-"))
    try:
        rates: dict[int, float] = {}
        joins: list[tuple[float, float]] = []
        leaves: list[float] = []
        if args.goodput_only:
            leaves += await goodput(server, bus, workdir, 3600 / per_hour, args.window, "(a)")
            leaves += await goodput(server, bus, workdir, args.churn_every, args.window, "(b)")
            print(latency_line("leave latency (SIGTERM -> exit, grace 10s)", leaves))
            return
        for trainers in (1, 2, 3, 4):
            rates[trainers], join, leave = await steady(server, bus, workdir, trainers, args.window)
            joins += join
            leaves += leave
            print(f"steady {trainers} trainer(s): {rates[trainers]:8.0f} samples/s", flush=True)
        leaves += await goodput(server, bus, workdir, 3600 / per_hour, args.window, "(a)")
        leaves += await goodput(server, bus, workdir, args.churn_every, args.window, "(b)")
        print(
            f"scaling: 2 trainers {rates[2] / rates[1]:.2f}x, 3 {rates[3] / rates[1]:.2f}x, "
            f"4 {rates[4] / rates[1]:.2f}x of one"
        )
        print(latency_line("steady jobs' joins, process start -> first applied batch",
                           [a for a, _ in joins]))  # fmt: skip
        print(latency_line("leave latency (SIGTERM -> exit, grace 10s)", leaves))
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
    parser.add_argument("--churn-every", type=float, default=20.0, help="(b): seconds per change")
    parser.add_argument(
        "--per-hour", type=float, default=50.0,
        help="(a): trainer changes per job-hour (default 50: family-periodic-spikes, 6 h)",
    )  # fmt: skip
    parser.add_argument(
        "--simulated", type=Path, nargs="*", default=[],
        help="`tideshift simulate --json` outputs; (a) takes their highest rate",
    )  # fmt: skip
    parser.add_argument("--goodput-only", action="store_true", help="only goodput (a) and (b)")
    args = parser.parse_args()
    if args.quick:
        args.window = 10.0
    asyncio.run(run(args))


if __name__ == "__main__":
    main()
