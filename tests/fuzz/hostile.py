"""What the fuzz suites send and how they read a service back: the corpus of hostile payloads,
hypothesis mutations of a valid event or pserver request, and a running service's health
and counters over HTTP."""

from __future__ import annotations

import asyncio
import contextlib
import json
import struct
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Generic, TypeVar

from hypothesis import HealthCheck, Phase, settings
from hypothesis import strategies as st
from nats.aio.msg import Msg

from tideshift import events
from tideshift.events.codec import DEFAULT_MAX_BYTES, EventRejected, decode
from tideshift.events.subjects import BoundSubject
from tideshift.services.common.bus import Bus
from tideshift.services.common.ports import free_port
from tideshift.services.trainer.core.wire import pack

CORPUS = Path(__file__).parent / "corpus"
T = TypeVar("T", bound=events.EventData)
TIDESHIFT = str(Path(sys.executable).parent / "tideshift")
# What a service may grow by over a whole suite of hostile cases (its start is ~100-200 MB).
MEMORY_GROWTH_MB = 150.0

# One seeded draw per run: the services are processes, so a test is one long example, and the
# same payloads every run (a failure reproduces).
one_seeded_draw = settings(
    max_examples=1,
    phases=[Phase.generate],
    derandomize=True,
    deadline=None,
    suppress_health_check=list(HealthCheck),
)


def refused(payload: bytes, model: type[events.EventData]) -> bool:
    """Whether the contract rejects `payload` as a `model` (what a consumer dead-letters)."""
    try:
        decode(payload, model)
    except EventRejected:
        return True
    return False


def corpus() -> dict[str, bytes]:
    """Every file of tests/fuzz/corpus/ plus two generated monsters, by name."""
    payloads = {path.name: path.read_bytes() for path in sorted(CORPUS.iterdir())}
    payloads["deep-100000"] = b"[" * 100_000
    payloads["oversized"] = b'{"pad":"' + b"x" * (DEFAULT_MAX_BYTES + 10) + b'"}'
    return payloads


JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=12),
    lambda children: (
        st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=8), children, max_size=3)
    ),
    max_leaves=12,
)


@st.composite
def mutations(draw: st.DrawFn, valid: bytes) -> bytes:
    """A valid event's encoding with one field replaced or dropped, cut short, a byte made
    invalid UTF-8, or its data nested hundreds to thousands deep."""
    body = json.loads(valid)
    how = draw(st.sampled_from(["field", "truncate", "flip", "nest", "drop"]))
    if how == "field":
        key = draw(st.sampled_from(sorted(body["data"])))
        body["data"][key] = draw(JSON_VALUES)
        return json.dumps(body, allow_nan=True).encode()
    if how == "drop":
        del body[draw(st.sampled_from(["id", "type", "data", "specversion"]))]
        return json.dumps(body).encode()
    if how == "nest":
        depth = draw(st.integers(min_value=500, max_value=20_000))
        body["data"] = json.loads("[" * 10 + "]" * 10)  # placeholder replaced below
        text = json.dumps(body).replace("[[[[[[[[[[]]]]]]]]]]", "[" * depth + "]" * depth)
        return text.encode()
    return _cut_or_flip(draw, valid, how)


@st.composite
def wire_mutations(draw: st.DrawFn, header: dict[str, Any]) -> bytes:
    """A pserver request (length-prefixed JSON header, wire.py) with one header field replaced
    or dropped, cut short, a byte flipped, a lying length prefix, or a deeply nested header."""
    how = draw(st.sampled_from(["field", "drop", "truncate", "flip", "length", "nest"]))
    if how == "field":
        key = draw(st.sampled_from(sorted(header)))
        return pack({**header, key: draw(JSON_VALUES)})
    if how == "drop":
        key = draw(st.sampled_from(sorted(header)))
        return pack({name: value for name, value in header.items() if name != key})
    if how == "length":
        valid = pack(header)
        return struct.pack(">I", draw(st.integers(0, 2**32 - 1))) + valid[4:]
    if how == "nest":
        nested = b"[" * draw(st.integers(min_value=500, max_value=60_000))
        return struct.pack(">I", len(nested)) + nested
    return _cut_or_flip(draw, pack(header), how)


def _cut_or_flip(draw: st.DrawFn, valid: bytes, how: str) -> bytes:
    if how == "truncate":
        return valid[: draw(st.integers(min_value=0, max_value=len(valid) - 1))]
    position = draw(st.integers(min_value=0, max_value=len(valid) - 1))
    return valid[:position] + b"\xff" + valid[position + 1 :]


@dataclass
class Service:
    """A service process with its health port (/healthz, /readyz, /metrics)."""

    name: str
    process: subprocess.Popen[bytes]
    health_port: int
    log: Path

    def get(self, path: str) -> tuple[int, str]:
        try:
            with urllib.request.urlopen(
                f"http://127.0.0.1:{self.health_port}{path}", timeout=5
            ) as answer:
                return answer.status, answer.read().decode()
        except urllib.error.HTTPError as error:
            return error.code, error.read().decode()
        except OSError as error:
            return 0, str(error)

    def metric(self, name: str, **labels: str) -> float:
        """Sum of a counter's samples whose labels include `labels`."""
        return metric_in(self.get("/metrics")[1], name, **labels)


def metric_in(text: str, name: str, **labels: str) -> float:
    """Sum of the samples of counter `name` in a /metrics page whose labels include `labels`."""
    total = 0.0
    for line in text.splitlines():
        if not line.startswith(name + "{"):
            continue
        label_text, _, value = line[len(name) + 1 :].rpartition("} ")
        if all(f'{key}="{wanted}"' in label_text for key, wanted in labels.items()):
            total += float(value)
    return total


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError(f"no VmRSS for {pid}")


def start_service(name: str, nats_url: str, logs: Path, extra: list[str]) -> Service:
    """`tideshift run <name>` on `nats_url`, its health port on loopback, its log in `logs`."""
    port = free_port("127.0.0.1")
    log = logs / f"{name}.log"
    where = ["--nats-url", nats_url, "--health-host", "127.0.0.1", "--health-port", str(port)]
    with log.open("ab") as handle:
        process = subprocess.Popen(
            [TIDESHIFT, "run", name, *where, *extra],
            stdin=subprocess.DEVNULL,
            stdout=handle,
            stderr=handle,
        )
    return Service(name, process, port, log)


class Services:
    """Running services, their memory at start, and the checks made after every case."""

    def __init__(self, services: dict[str, Service]) -> None:
        self.services = services
        self.start_rss: dict[str, float] = {}

    def wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while not all(s.get("/readyz")[0] == 200 for s in self.services.values()):
            for service in self.services.values():
                assert service.process.poll() is None, service.log.read_text()[-3000:]
            assert time.monotonic() < deadline, {
                s.name: s.get("/readyz") for s in self.services.values()
            }
            time.sleep(0.2)
        self.start_rss = {name: rss_mb(s.process.pid) for name, s in self.services.items()}

    def healthy(self) -> None:
        """Each service runs, says so on /healthz and /readyz, and grew less than the bound."""
        for service in self.services.values():
            assert service.process.poll() is None, service.log.read_text()[-3000:]
            for path in ("/healthz", "/readyz"):
                status, body = service.get(path)
                assert status == 200, f"{service.name} {path}: {status} {body}"
            grown = rss_mb(service.process.pid) - self.start_rss[service.name]
            assert grown < MEMORY_GROWTH_MB, f"{service.name} grew {grown:.0f} MB"

    def stop(self) -> None:
        for service in self.services.values():
            service.process.terminate()
        for service in self.services.values():
            try:
                service.process.wait(20)
            except subprocess.TimeoutExpired:
                service.process.kill()
                service.process.wait(10)


class Recorder(Generic[T]):
    """Every valid event on a (wildcard) subject from the moment `start` returns: it subscribes
    and flushes first, so nothing published afterwards can be missed (an async generator only
    subscribes once iterated, which can be after the answer was already sent)."""

    def __init__(self, bus: Bus, subject: BoundSubject[T]) -> None:
        self.bus = bus
        self.subject = subject
        self.seen: list[T] = []
        self._arrived = asyncio.Event()

    async def start(self) -> Recorder[T]:
        async def keep(msg: Msg) -> None:
            with contextlib.suppress(EventRejected):
                self.seen.append(decode(msg.data, self.subject.subject.model).data)
                self._arrived.set()

        await self.bus.connection.subscribe(self.subject.value, cb=keep)
        await self.bus.flush()
        return self

    async def wait_for(self, check: Callable[[list[T]], Any], timeout: float, what: str) -> Any:
        """The first truthy `check(seen)`, re-checked as events arrive; fails after `timeout`."""
        deadline = time.monotonic() + timeout
        while not (found := check(self.seen)):
            left = deadline - time.monotonic()
            assert left > 0, f"no {what} within {timeout:g} s; saw {self.seen[-5:]}"
            self._arrived.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._arrived.wait(), min(left, 1.0))
        return found
