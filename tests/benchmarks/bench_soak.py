"""Benchmark (issue 25 part 4): does memory stay bounded when every consumed subject is flooded
with names nobody announced?

Runs a real nats-server and the planner and predictor as processes (`tideshift run ...`; the
predictor on its sim metric source, so neither needs a cluster), then floods each subject they
consume with `--names` distinct valid events: workloads announced (`WorkloadChanged`) and then
deleted (objects that came and went: "after" is what the services keep once they are gone; the
peak is what the announced ones cost while they existed, at most the predictor's
max_announced_workloads), forecasts, observed demand and scale results for unknown workloads,
pods, and deleted nodes. Each subject
is published for at most `--budget` seconds (the count actually sent is printed). RSS of each
service (VmRSS from /proc) is printed before the flood, at its peak, and after it once the
predictor forecasts none of the flood's workloads any more (at most `--settle` seconds); the
goal is "after" within 50 MB of "before".

Usage: .venv/bin/python tests/benchmarks/bench_soak.py [--names 1000000] [--budget 120]
       [--settle 30] [--only workload]   (--only: the subjects whose label contains it)
It asserts nothing; it prints figures.
"""

from __future__ import annotations

import argparse
import asyncio
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from tideshift import events  # noqa: E402
from tideshift.services.common.bus import Bus  # noqa: E402
from tideshift.services.common.embedded_nats import EmbeddedNats  # noqa: E402
from tideshift.services.common.ports import free_port  # noqa: E402

TIDESHIFT = str(Path(sys.executable).parent / "tideshift")
GOAL_MB = 50.0
NOW = datetime.now(UTC)


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for {pid}")


def ready(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=2) as answer:
            return bool(answer.status == 200)
    except (urllib.error.URLError, OSError):
        return False


def metric(port: int, name: str) -> float | None:
    """An unlabelled sample from a service's /metrics; None when absent or unreachable."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as answer:
            lines = answer.read().decode().splitlines()
    except OSError:
        return None
    return next((float(line.split()[1]) for line in lines if line.startswith(name + " ")), None)


async def caught_up(port: int, settle_s: float) -> float:
    """Seconds until the predictor forecasts no workload (the flood's were all deleted; a
    dropped deletion waits for its resync with the snapshot), at most `settle_s`."""
    started = time.monotonic()
    while time.monotonic() - started < settle_s:
        if metric(port, "tideshift_predictor_workloads") == 0:
            break
        await asyncio.sleep(0.5)
    return time.monotonic() - started


async def settled_rss(pid: int, *, timeout_s: float) -> None:
    """Until the process's RSS stops falling (two readings 0.5 s apart within 1 MB), at most
    `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    previous = rss_mb(pid)
    while time.monotonic() < deadline:
        await asyncio.sleep(0.5)
        current = rss_mb(pid)
        if previous - current < 1.0:
            return
        previous = current


def ref(index: int) -> events.WorkloadRef:
    return events.WorkloadRef(kind="Deployment", namespace="soak", name=f"w-{index}")


def _workload(i: int) -> tuple[str, events.EventData]:
    event = events.WorkloadChanged(
        change="added",
        workload=ref(i),
        role="serving",
        replicas=1,
        requests=events.Resources(cpu=0.01),
        serving=events.ServingPolicy(capacity_rps=10),
        observed_at=NOW,
    )
    return events.WORKLOAD_CHANGED.at(
        namespace="soak", kind="Deployment", name=f"w-{i}"
    ).value, event


def _gone(i: int) -> tuple[str, events.EventData]:
    """The announced workload `i` deleted: the flood's objects came and went."""
    subject, event = _workload(i)
    assert isinstance(event, events.WorkloadChanged)
    return subject, event.model_copy(update={"change": "deleted"})


def _forecast(i: int) -> tuple[str, events.EventData]:
    point = events.ForecastPoint(at=NOW, point=1, q50=1, q90=2, q95=3, q99=4)
    event = events.ForecastIssued(
        workload=ref(i), issued_at=NOW, step_seconds=60, model="m", points=(point,)
    )
    return events.FORECAST.at(namespace="soak", workload=f"w-{i}").value, event


def _observed(i: int) -> tuple[str, events.EventData]:
    event = events.DemandObserved(workload=ref(i), rps=5.0, observed_at=NOW)
    return events.DEMAND_OBSERVED.at(namespace="soak", workload=f"w-{i}").value, event


def _result(i: int) -> tuple[str, events.EventData]:
    event = events.ScaleResult(
        target=ref(i), idempotency_key=f"k-{i}", outcome="noop", desired=1, executed_at=NOW
    )
    values = {p: "soak" if p == "namespace" else f"w-{i}" for p in events.SCALE_RESULT.params}
    return events.SCALE_RESULT.at(**values).value, event


def _pod(i: int) -> tuple[str, events.EventData]:
    event = events.PodChanged(
        change="deleted", namespace="soak", name=f"p-{i}", phase="Running", observed_at=NOW
    )
    return events.POD_CHANGED.at(namespace="soak", name=f"p-{i}").value, event


def _node(i: int) -> tuple[str, events.EventData]:
    event = events.NodeChanged(
        change="deleted", name=f"n-{i}", allocatable=events.Resources(cpu=4), observed_at=NOW
    )
    return events.NODE_CHANGED.at(name=f"n-{i}").value, event


FLOODS: dict[str, Callable[[int], tuple[str, events.EventData]]] = {
    "workload.changed (serving, announced)": _workload,
    "workload.changed (the same, deleted)": _gone,
    "forecast (unannounced)": _forecast,
    "demand.observed (unannounced)": _observed,
    "scale.result (unknown target)": _result,
    "pod.changed (deleted, unknown)": _pod,
    "node.changed (deleted, unknown)": _node,
}


class Sampler:
    """Peak RSS per service, sampled in the background while the flood runs."""

    def __init__(self, pids: dict[str, int]) -> None:
        self.pids = pids
        self.peak = {name: rss_mb(pid) for name, pid in pids.items()}

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            for name, pid in self.pids.items():
                self.peak[name] = max(self.peak[name], rss_mb(pid))
            await asyncio.sleep(0.2)


async def flood(url: str, names: int, budget_s: float, only: str) -> dict[str, int]:
    bus = await Bus.connect(url, name="soak")
    sent: dict[str, int] = {}
    try:
        for label, make in FLOODS.items():
            if only not in label:
                continue
            deadline = time.monotonic() + budget_s
            # Deletions go to the names announced, however many the budget allowed.
            wanted = (
                sent.get("workload.changed (serving, announced)", names) if make is _gone else names
            )
            count = 0
            while count < wanted and time.monotonic() < deadline:
                subject, event = make(count)
                await bus.connection.publish(subject, events.encode(event, source="soak"))
                count += 1
                if count % 1000 == 0:
                    await bus.flush(timeout=60)
            await bus.flush(timeout=60)
            sent[label] = count
            print(f"  {label}: {count:,} sent", flush=True)
    finally:
        await bus.close()
    return sent


def start(
    name: str, nats_url: str, logs: Path, extra: list[str]
) -> tuple[subprocess.Popen[bytes], int]:
    port = free_port("127.0.0.1")
    with (logs / f"{name}.log").open("ab") as log:
        process = subprocess.Popen(
            [
                TIDESHIFT,
                "run",
                name,
                "--nats-url",
                nats_url,
                "--health-host",
                "127.0.0.1",
                "--health-port",
                str(port),
                "--log-level",
                "WARNING",
                *extra,
            ],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=log,
        )
    return process, port


async def main_async(args: argparse.Namespace) -> None:
    logs = Path(tempfile.mkdtemp(prefix="soak-"))
    with EmbeddedNats() as nats:
        processes = {
            "planner": start("planner", nats.url, logs, ["--instance", "soak"]),
            "predictor": start(
                "predictor", nats.url, logs, ["--metric-source", "sim", "--model", "tidal"]
            ),
        }
        try:
            deadline = time.monotonic() + 120
            while not all(ready(port) for _, port in processes.values()):
                if time.monotonic() > deadline or any(
                    p.poll() is not None for p, _ in processes.values()
                ):
                    raise SystemExit(f"services not ready in 120 s; logs in {logs}")
                await asyncio.sleep(0.2)
            pids = {name: process.pid for name, (process, _) in processes.items()}
            before = {name: rss_mb(pid) for name, pid in pids.items()}
            sampler, stop = Sampler(pids), asyncio.Event()
            watching = asyncio.create_task(sampler.run(stop))
            print(f"flooding {args.names:,} names per subject (at most {args.budget:g} s each)")
            await flood(nats.url, args.names, args.budget, args.only)
            took = await caught_up(processes["predictor"][1], args.settle)
            # the predictor hands removed models' memory back about 1 s after removing them
            await settled_rss(processes["predictor"][0].pid, timeout_s=15)
            stop.set()
            await watching
            after = {name: rss_mb(pid) for name, pid in pids.items()}
            alive = {name: process.poll() is None for name, (process, _) in processes.items()}
            header = ("service", "before MB", "peak MB", "after MB", "after-before")
            print(
                "\n{:<10} {:>10} {:>10} {:>10} {:>13}".format(*header), f" goal <= {GOAL_MB:g} MB"
            )
            for name in pids:
                grown = after[name] - before[name]
                verdict = (
                    "ok" if grown <= GOAL_MB and alive[name] else "OVER" if alive[name] else "DIED"
                )
                figures = (before[name], sampler.peak[name], after[name])
                print(
                    f"{name:<10}", *(f"{mb:>10.1f}" for mb in figures), f"{grown:>+13.1f}", verdict
                )
            port = processes["predictor"][1]
            at_cap = metric(port, "tideshift_predictor_announcements_skipped_total")
            left = metric(port, "tideshift_predictor_workloads")
            print(f"\npredictor: {at_cap} announcements skipped at the cap; {left} workloads")
            print(f"forecast {took:.0f} s after the flood (at most --settle {args.settle:g})")
            print(f"logs: {logs}")
        finally:
            for process, _ in processes.values():
                process.terminate()
            for process, _ in processes.values():
                process.wait(20)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--names", type=int, default=1_000_000, help="distinct names per subject")
    parser.add_argument("--budget", type=float, default=120.0, help="seconds per subject at most")
    parser.add_argument(
        "--settle",
        type=float,
        default=600.0,
        help="at most this long for the predictor to drop "
        "the flood's workloads (it resyncs with the snapshot every 2 min)",
    )
    parser.add_argument("--only", default="", help="flood only the subjects whose label has this")
    asyncio.run(main_async(parser.parse_args()))


if __name__ == "__main__":
    main()
