"""The open-loop HTTP driver: Poisson arrivals at rate(t), whatever the server does.

Arrival times are drawn in advance of the responses, so a slow server cannot slow the load
(a closed loop would wait for answers and under-report exactly the overload we want to see).
At most `max_in_flight` requests are outstanding; an arrival beyond that is counted as dropped
and never queued, because a queue inside the load generator would turn it back into a closed
loop. The connection pool is as large as the in-flight bound for the same reason.

Time comes through a `Clock` port (the event loop's by default), so the schedule of intended
send times can be checked exactly with a clock that a test moves; how late each request left
(send lag, when the machine is busy) is reported, never corrected by skipping arrivals.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import math
import random
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Protocol
from urllib.parse import urlsplit

import aiohttp

from tideshift.loadgen.core.profiles import RateProfile

# When the rate is zero, look again this often (profile time moves on meanwhile).
IDLE_POLL_S = 0.05


class Clock(Protocol):
    """Seconds on a monotonic clock, and a way to wait for some of them to pass."""

    def now(self) -> float: ...

    async def sleep(self, seconds: float) -> None: ...


class LoopClock:
    """The running event loop's monotonic clock."""

    def now(self) -> float:
        return asyncio.get_running_loop().time()

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)


# Called once per request sent: (intended send time, actual send time), seconds since start.
OnSend = Callable[[float, float], None]


class TargetRefused(ValueError):
    """The target is not loopback and was not explicitly allowed."""


def in_cluster_names(service: str) -> set[str]:
    """The DNS names a Kubernetes Service `name` or `name.namespace` answers to in-cluster."""
    parts = service.split(".")
    names = {service}
    if len(parts) >= 2:
        name, namespace = parts[0], parts[1]
        names |= {
            f"{name}.{namespace}",
            f"{name}.{namespace}.svc",
            f"{name}.{namespace}.svc.cluster.local",
        }
    return names


def check_target(url: str, *, allowed_hosts: Iterable[str] = ()) -> str:
    """The URL's host if load may go there: loopback, or a host named in `allowed_hosts`."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https"):
        raise TargetRefused(f"--target {url!r}: expected an http:// or https:// URL")
    host = (parts.hostname or "").lower()
    if not host:
        raise TargetRefused(f"--target {url!r}: the URL has no host")
    allowed = {name.lower() for name in allowed_hosts}
    if host in allowed:
        return host
    if host == "localhost" or host.endswith(".localhost"):
        return host
    try:
        if ipaddress.ip_address(host).is_loopback:
            return host
    except ValueError:
        pass
    raise TargetRefused(
        f"refusing to send load to {host!r}: not a loopback address. Load tests can hurt real "
        f"services; if {host!r} is yours, pass --allow-target {host} "
        "(or --in-cluster-service NAME.NAMESPACE for a Kubernetes Service)"
    )


@dataclass
class LoadStats:
    """Counts and latencies so far. `offered` = arrivals = sent + dropped."""

    sent: int = 0
    succeeded: int = 0
    failed: int = 0
    dropped: int = 0
    in_flight: int = 0
    expected: float = 0.0  # the integral of the target rate so far
    latencies_s: list[float] = field(default_factory=list)
    failures: dict[str, int] = field(default_factory=dict)  # "503", "timeout", "connect", ...
    elapsed_s: float = 0.0
    lag_total_s: float = 0.0  # sum over sent requests of (actual - intended send time)
    lag_max_s: float = 0.0

    @property
    def offered(self) -> int:
        return self.sent + self.dropped

    def count_failure(self, kind: str) -> None:
        self.failed += 1
        self.failures[kind] = self.failures.get(kind, 0) + 1

    def percentile(self, fraction: float) -> float | None:
        if not self.latencies_s:
            return None
        ordered = sorted(self.latencies_s)
        index = min(len(ordered) - 1, max(0, math.ceil(fraction * len(ordered)) - 1))
        return ordered[index]

    def summary(self) -> dict[str, object]:
        elapsed = max(self.elapsed_s, 1e-9)
        return {
            "elapsed_s": round(self.elapsed_s, 3),
            "expected": round(self.expected, 1),
            "offered": self.offered,
            "sent": self.sent,
            "succeeded": self.succeeded,
            "failed": self.failed,
            "dropped": self.dropped,
            "offered_rps": round(self.offered / elapsed, 2),
            "target_rps": round(self.expected / elapsed, 2),
            "latency_s": {
                name: (None if value is None else round(value, 4))
                for name, value in (
                    ("p50", self.percentile(0.50)),
                    ("p90", self.percentile(0.90)),
                    ("p99", self.percentile(0.99)),
                    ("max", self.percentile(1.0)),
                )
            },
            "failures": dict(sorted(self.failures.items())),
            "send_lag_s": {
                "mean": round(self.lag_total_s / self.sent, 4) if self.sent else None,
                "max": round(self.lag_max_s, 4),
            },
        }


@dataclass(frozen=True)
class DriverConfig:
    target: str
    duration_s: float  # wall seconds
    max_in_flight: int = 256
    timeout_s: float = 5.0
    speed: float = 1.0  # profile seconds per wall second
    profile_start_s: float = 0.0
    seed: int = 0
    method: str = "GET"


async def drive(
    profile: RateProfile,
    config: DriverConfig,
    *,
    on_progress: Callable[[LoadStats, float], None] | None = None,
    progress_every_s: float = 1.0,
    stop: asyncio.Event | None = None,
    clock: Clock | None = None,
    on_send: OnSend | None = None,
) -> LoadStats:
    """Send requests to `config.target` at rate(t) for `config.duration_s` wall seconds.

    rate(t) is read at profile time `profile_start_s + speed * elapsed`. Inter-arrival gaps are
    exponential with the current rate (a piecewise-constant Poisson process, exact while the
    rate is steady over a gap). `on_progress(stats, profile_time)` is called periodically;
    `on_send(intended, actual)` once per request sent.
    """
    connector = aiohttp.TCPConnector(limit=config.max_in_flight, limit_per_host=0)
    timeout = aiohttp.ClientTimeout(total=config.timeout_s)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        run = _OpenLoopRun(profile, config, session, clock or LoopClock(), on_send)
        await run.until_done(on_progress, progress_every_s, stop)
        await run.settle_outstanding()
    return run.stats


class _OpenLoopRun:
    """One run of the driver: the arrival schedule, the requests in flight and their stats."""

    def __init__(
        self,
        profile: RateProfile,
        config: DriverConfig,
        session: aiohttp.ClientSession,
        clock: Clock,
        on_send: OnSend | None,
    ) -> None:
        self._profile = profile
        self._config = config
        self._session = session
        self._clock = clock
        self._on_send = on_send
        self._randomness = random.Random(config.seed)
        self._tasks: set[asyncio.Task[None]] = set()
        self._started = clock.now()
        self._next_arrival = 0.0  # wall seconds since start
        self._last_expected_at = 0.0
        self.stats = LoadStats()

    def profile_time(self, elapsed: float) -> float:
        return self._config.profile_start_s + self._config.speed * elapsed

    def wall_rate(self, elapsed: float) -> float:
        # rate(t) is per profile second of traffic shape but per wall second of requests: the
        # speed compresses the day, not the request rate (amplitude does that).
        return max(0.0, self._profile.rate(self.profile_time(elapsed)))

    async def until_done(
        self,
        on_progress: Callable[[LoadStats, float], None] | None,
        progress_every_s: float,
        stop: asyncio.Event | None,
    ) -> None:
        """Fire arrivals as they fall due until the duration is over or `stop` is set."""
        duration = self._config.duration_s
        next_progress = progress_every_s
        while True:
            elapsed = self._clock.now() - self._started
            if stop is not None and stop.is_set():
                break
            # Arrivals that fell due while the loop was held up leave now, late (the lag says
            # how late), so what was offered never depends on how busy the machine is.
            self._fire_due_arrivals(elapsed)
            if elapsed >= duration:
                break
            self._integrate_expected(elapsed)
            if elapsed >= next_progress:
                # Moved on even without a listener: a wake-up time in the past would spin.
                next_progress += progress_every_s
                if on_progress is not None:
                    on_progress(self.stats, self.profile_time(elapsed))
            wake_in = min(self._next_arrival, duration, next_progress) - elapsed
            await self._clock.sleep(max(0.0, wake_in))
        self._integrate_expected(min(self._clock.now() - self._started, duration))

    def _fire_due_arrivals(self, elapsed: float) -> None:
        """Every arrival that is due (a catch-up burst if the loop fell behind)."""
        while self._next_arrival <= elapsed and self._next_arrival < self._config.duration_s:
            if self.stats.in_flight >= self._config.max_in_flight:
                self.stats.dropped += 1
            else:
                self._count_send(self._next_arrival, elapsed)
                self.stats.in_flight += 1
                task = asyncio.create_task(self._one_request())
                self._tasks.add(task)
                task.add_done_callback(self._tasks.discard)
            self._next_arrival = self._arrival_after(self._next_arrival)

    def _count_send(self, intended: float, actual: float) -> None:
        self.stats.sent += 1
        lag = actual - intended
        self.stats.lag_total_s += lag
        self.stats.lag_max_s = max(self.stats.lag_max_s, lag)
        if self._on_send is not None:
            self._on_send(intended, actual)

    def _arrival_after(self, arrival: float) -> float:
        rate = self.wall_rate(arrival)
        if rate > 0:
            return arrival + self._randomness.expovariate(rate)
        arrival += IDLE_POLL_S
        while arrival < self._config.duration_s and self.wall_rate(arrival) <= 0:
            arrival += IDLE_POLL_S
        # A fresh exponential gap from the moment the rate turns positive.
        rate = self.wall_rate(arrival)
        if rate > 0:
            arrival += self._randomness.expovariate(rate)
        return arrival

    def _integrate_expected(self, elapsed: float) -> None:
        """Integrate the target rate up to `elapsed` (midpoint of each slice)."""
        midpoint = (self._last_expected_at + elapsed) / 2
        self.stats.expected += self.wall_rate(midpoint) * max(0.0, elapsed - self._last_expected_at)
        self._last_expected_at = elapsed
        self.stats.elapsed_s = elapsed

    async def settle_outstanding(self) -> None:
        """Outstanding requests finish (or time out) so every sent request is accounted for."""
        tasks = self._tasks
        if tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.wait(set(tasks), timeout=self._config.timeout_s + 1.0)
        for task in list(tasks):
            task.cancel()
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)

    async def _one_request(self) -> None:
        stats = self.stats
        started = self._clock.now()
        try:
            async with self._session.request(self._config.method, self._config.target) as response:
                await response.read()
                if 200 <= response.status < 300:
                    stats.succeeded += 1
                    stats.latencies_s.append(self._clock.now() - started)
                else:
                    stats.count_failure(str(response.status))
        except TimeoutError:
            stats.count_failure("timeout")
        except aiohttp.ClientError as error:
            stats.count_failure(type(error).__name__)
        except asyncio.CancelledError:
            stats.count_failure("unfinished")
            raise
        finally:
            stats.in_flight -= 1
