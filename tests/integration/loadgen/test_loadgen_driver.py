"""The open-loop driver against real HTTP servers on loopback."""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator, Callable

import aiohttp
import pytest
from aiohttp import web

from tideshift.loadgen.driver import DriverConfig, drive
from tideshift.loadgen.profiles import ConstantProfile, DiurnalProfile
from tideshift.loadgen.sample_app import SampleAppConfig, start_sample_app


@pytest.fixture
async def slow_server() -> AsyncIterator[Callable[[float], str]]:
    """Starts servers answering every request after a fixed delay; yields a factory of URLs."""
    runners: list[web.AppRunner] = []

    async def start(delay_s: float) -> str:
        async def handler(request: web.Request) -> web.Response:
            await asyncio.sleep(delay_s)
            return web.Response(text="ok")

        app = web.Application()
        app.add_routes([web.get("/", handler)])
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        runners.append(runner)
        port = runner.addresses[0][1]
        return f"http://127.0.0.1:{port}/"

    yield start  # type: ignore[misc]
    for runner in runners:
        await runner.cleanup()


async def test_holds_the_target_rate_against_a_slow_server(slow_server) -> None:  # type: ignore[no-untyped-def]
    # A closed loop with one connection would manage ~3 req/s here; open loop sends 150.
    url = await slow_server(0.3)
    stats = await drive(
        ConstantProfile(150.0), DriverConfig(target=url, duration_s=6.0, max_in_flight=256, seed=1)
    )
    assert stats.dropped == 0
    assert stats.failed == 0
    assert stats.sent == pytest.approx(stats.expected, rel=0.05)
    assert stats.expected == pytest.approx(900.0, rel=0.02)
    p50 = stats.percentile(0.5)
    assert p50 is not None and p50 >= 0.3  # the server really was slow


async def test_excess_arrivals_are_dropped_not_queued(slow_server) -> None:  # type: ignore[no-untyped-def]
    url = await slow_server(5.0)
    stats = await drive(
        ConstantProfile(100.0),
        DriverConfig(target=url, duration_s=3.0, max_in_flight=10, timeout_s=1.0, seed=2),
    )
    assert stats.sent <= 40  # ten at a time, each timing out after a second
    assert stats.dropped > 200
    # Dropping keeps the arrival process itself on schedule.
    assert stats.offered == pytest.approx(stats.expected, rel=0.07)
    assert stats.failures.get("timeout", 0) == stats.sent
    assert stats.in_flight == 0


async def test_follows_a_time_varying_profile_at_speed(slow_server) -> None:  # type: ignore[no-untyped-def]
    # A 60 s "day" played at speed 10 over 6 s: the rate swings between 20 and 200 req/s.
    url = await slow_server(0.01)
    profile = DiurnalProfile(peak_rps=200, trough_rps=20, peak_hour=12, day_s=60.0)
    stats = await drive(profile, DriverConfig(target=url, duration_s=6.0, speed=10.0, seed=3))
    # The midday half carries most of the day's requests (integral: 110 * 6 = 660).
    assert stats.expected == pytest.approx(660.0, rel=0.03)
    assert stats.sent == pytest.approx(stats.expected, rel=0.08)


async def test_sample_app_serves_its_capacity_and_sheds_the_rest() -> None:
    runner, port = await start_sample_app(
        SampleAppConfig(app="shop", capacity_rps=40, service_time_s=0.05, latency_target_s=0.2)
    )
    try:
        url = f"http://127.0.0.1:{port}/"
        stats = await drive(ConstantProfile(100.0), DriverConfig(target=url, duration_s=5.0))
        served_rps = stats.succeeded / stats.elapsed_s
        assert 30 <= served_rps <= 44  # capacity 40 req/s
        assert stats.failures.get("503", 0) > 100
        latency = stats.percentile(0.99)
        assert latency is not None and latency < 0.35  # within the latency target
        async with (
            aiohttp.ClientSession() as session,
            session.get(f"http://127.0.0.1:{port}/metrics") as response,
        ):
            text = await response.text()
    finally:
        await runner.cleanup()
    ok = re.search(r'^http_requests_total\{app="shop",code="200"\} (\S+)$', text, re.M)
    shed = re.search(r'^http_requests_total\{app="shop",code="503"\} (\S+)$', text, re.M)
    assert ok is not None and float(ok.group(1)) == stats.succeeded
    assert shed is not None and float(shed.group(1)) == stats.failures["503"]
    assert re.search(r'^http_request_duration_seconds_bucket\{app="shop",le="0.25"\}', text, re.M)
    assert 'sample_app_capacity_rps{app="shop"} 40.0' in text
