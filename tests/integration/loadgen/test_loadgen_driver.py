"""The open-loop driver against real HTTP servers on loopback.

Pacing is checked exactly with a clock the test moves; against the real clock only what does
not depend on the machine's speed is asserted (every request sent arrived and was answered;
arrivals are offered on schedule even when late). Throughput figures are in
tests/benchmarks/bench_loadgen.py.
"""

from __future__ import annotations

import asyncio
import random
import re
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass

import aiohttp
import pytest
from aiohttp import web

from tideshift.loadgen.core.profiles import ConstantProfile, DiurnalProfile
from tideshift.loadgen.driver import DriverConfig, drive
from tideshift.loadgen.sample_app import SampleAppConfig, start_sample_app


@dataclass
class CountingServer:
    url: str
    received: int = 0


StartServer = Callable[[float], Awaitable[CountingServer]]


@pytest.fixture
async def slow_server() -> AsyncIterator[StartServer]:
    """Starts servers answering every request after a fixed delay and counting what arrived."""
    runners: list[web.AppRunner] = []

    async def start(delay_s: float) -> CountingServer:
        server = CountingServer(url="")

        async def handler(request: web.Request) -> web.Response:
            server.received += 1
            await asyncio.sleep(delay_s)
            return web.Response(text="ok")

        app = web.Application()
        app.add_routes([web.get("/", handler)])
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        runners.append(runner)
        server.url = f"http://127.0.0.1:{runner.addresses[0][1]}/"
        return server

    yield start
    for runner in runners:
        await runner.cleanup()


class SteppedClock:
    """A clock that moves only when the driver sleeps; `stall_at` adds one hold-up of the loop
    (a busy machine) the first time a sleep crosses that time."""

    def __init__(self, *, stall_at: float | None = None, stall_s: float = 0.0) -> None:
        self.time = 0.0
        self.stall_at = stall_at
        self.stall_s = stall_s

    def now(self) -> float:
        return self.time

    async def sleep(self, seconds: float) -> None:
        self.time += seconds
        if self.stall_at is not None and self.time >= self.stall_at:
            self.time += self.stall_s
            self.stall_at = None
        await asyncio.sleep(0)


def poisson_schedule(rate: float, duration: float, seed: int) -> list[float]:
    """The intended send times of a steady rate, computed apart from the driver."""
    randomness = random.Random(seed)
    times, arrival = [], 0.0
    while arrival < duration:
        times.append(arrival)
        arrival += randomness.expovariate(rate)
    return times


async def test_sends_on_the_exact_poisson_schedule(slow_server: StartServer) -> None:
    server = await slow_server(0.0)
    clock = SteppedClock()
    sends: list[tuple[float, float]] = []
    stats = await drive(
        ConstantProfile(40.0),
        DriverConfig(target=server.url, duration_s=5.0, max_in_flight=512, seed=7),
        clock=clock,
        on_send=lambda intended, actual: sends.append((intended, actual)),
    )
    assert [intended for intended, _ in sends] == poisson_schedule(40.0, 5.0, seed=7)
    assert all(actual == pytest.approx(intended, abs=1e-9) for intended, actual in sends)
    assert stats.sent == len(sends) and stats.dropped == 0
    assert stats.succeeded == stats.sent == server.received


async def test_a_held_up_loop_sends_late_never_fewer(slow_server: StartServer) -> None:
    server = await slow_server(0.0)
    clock = SteppedClock(stall_at=2.0, stall_s=1.5)
    sends: list[tuple[float, float]] = []
    stats = await drive(
        ConstantProfile(40.0),
        DriverConfig(target=server.url, duration_s=5.0, max_in_flight=512, seed=7),
        clock=clock,
        on_send=lambda intended, actual: sends.append((intended, actual)),
    )
    assert [intended for intended, _ in sends] == poisson_schedule(40.0, 5.0, seed=7)
    late = [actual - intended for intended, actual in sends if actual - intended > 1e-9]
    assert late and max(late) == pytest.approx(stats.lag_max_s)
    assert 1.4 < stats.lag_max_s <= 1.5 + 1e-9, "the stall shows as send lag"
    assert stats.summary()["send_lag_s"]["max"] == pytest.approx(stats.lag_max_s, abs=1e-4)  # type: ignore[index]
    assert stats.succeeded == stats.sent == server.received


async def test_a_stall_over_the_end_still_offers_every_arrival(slow_server: StartServer) -> None:
    server = await slow_server(0.0)
    clock = SteppedClock(stall_at=4.5, stall_s=3.0)
    stats = await drive(
        ConstantProfile(40.0),
        DriverConfig(target=server.url, duration_s=5.0, max_in_flight=512, seed=3),
        clock=clock,
    )
    assert stats.offered == len(poisson_schedule(40.0, 5.0, seed=3))
    assert server.received == stats.sent


async def test_follows_a_time_varying_profile_at_speed(slow_server: StartServer) -> None:
    # A 60 s "day" played at speed 10 over 6 s: the rate swings between 20 and 200 req/s.
    server = await slow_server(0.0)
    profile = DiurnalProfile(peak_rps=200, trough_rps=20, peak_hour=12, day_s=60.0)
    stats = await drive(
        profile,
        DriverConfig(target=server.url, duration_s=6.0, speed=10.0, max_in_flight=2048, seed=3),
        clock=SteppedClock(),
    )
    # The midday half carries most of the day's requests (integral: 110 * 6 = 660).
    assert stats.expected == pytest.approx(660.0, rel=0.03)
    assert stats.sent == pytest.approx(stats.expected, rel=0.08)
    assert stats.succeeded == stats.sent == server.received


async def test_against_a_slow_server_every_sent_request_arrives(slow_server: StartServer) -> None:
    # A closed loop with one connection would manage ~3 req/s here; open loop sends 150.
    server = await slow_server(0.3)
    stats = await drive(
        ConstantProfile(150.0),
        DriverConfig(target=server.url, duration_s=3.0, max_in_flight=1024, seed=1),
    )
    assert stats.offered == len(poisson_schedule(150.0, 3.0, seed=1))
    assert stats.dropped == 0 and stats.failed == 0
    assert stats.succeeded == stats.sent == server.received
    p50 = stats.percentile(0.5)
    assert p50 is not None and p50 >= 0.3  # the server really was slow


async def test_excess_arrivals_are_dropped_not_queued(slow_server: StartServer) -> None:
    server = await slow_server(5.0)
    stats = await drive(
        ConstantProfile(100.0),
        DriverConfig(target=server.url, duration_s=3.0, max_in_flight=10, timeout_s=1.0, seed=2),
    )
    assert stats.sent <= 40  # ten at a time, each timing out after a second
    assert stats.offered == len(poisson_schedule(100.0, 3.0, seed=2))
    assert stats.dropped == stats.offered - stats.sent
    assert stats.failures.get("timeout", 0) == stats.sent == server.received
    assert stats.in_flight == 0


async def test_sample_app_sheds_beyond_its_capacity_and_counts_it() -> None:
    config = SampleAppConfig(app="shop", capacity_rps=40, service_time_s=0.05, latency_target_s=0.2)
    runner, port = await start_sample_app(config)
    try:
        url = f"http://127.0.0.1:{port}/"
        stats = await drive(ConstantProfile(100.0), DriverConfig(target=url, duration_s=3.0))
        async with (
            aiohttp.ClientSession() as session,
            session.get(f"http://127.0.0.1:{port}/metrics") as response,
        ):
            text = await response.text()
    finally:
        await runner.cleanup()
    assert stats.succeeded + stats.failures.get("503", 0) == stats.sent
    # A slow machine serves less, never more, than the workers can in the time.
    assert stats.succeeded <= config.capacity_rps * (stats.elapsed_s + 1.0)
    ok = re.search(r'^http_requests_total\{app="shop",code="200"\} (\S+)$', text, re.M)
    shed = re.search(r'^http_requests_total\{app="shop",code="503"\} (\S+)$', text, re.M)
    assert ok is not None and float(ok.group(1)) == stats.succeeded
    assert shed is not None and float(shed.group(1)) == stats.failures.get("503", 0)
    assert re.search(r'^http_request_duration_seconds_bucket\{app="shop",le="0.25"\}', text, re.M)
    assert 'sample_app_capacity_rps{app="shop"} 40.0' in text
