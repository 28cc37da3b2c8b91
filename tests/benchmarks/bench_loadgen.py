"""Benchmark: how closely the open-loop driver keeps pace on this machine, and what the sample
app serves at its capacity. These figures depend on the machine (and on whatever else runs on
it), which is why they are printed here and not asserted by the tests.

Usage: .venv/bin/python tests/benchmarks/bench_loadgen.py [--seconds 6]
Prints, for each run, the target request count, what was sent, the ratio, and the send lag
(how late requests left their intended time); then the sample app's served rate against its
configured capacity.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path

from aiohttp import web

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from tideshift.loadgen.core.profiles import ConstantProfile, DiurnalProfile, RateProfile  # noqa: E402
from tideshift.loadgen.driver import DriverConfig, LoadStats, drive  # noqa: E402
from tideshift.loadgen.sample_app import SampleAppConfig, start_sample_app  # noqa: E402


async def _ok_server() -> tuple[web.AppRunner, str]:
    async def handler(request: web.Request) -> web.Response:
        return web.Response(text="ok")

    app = web.Application()
    app.add_routes([web.get("/", handler)])
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    return runner, f"http://127.0.0.1:{runner.addresses[0][1]}/"


def _line(name: str, stats: LoadStats) -> str:
    ratio = stats.sent / stats.expected if stats.expected else float("nan")
    mean_lag = stats.lag_total_s / stats.sent if stats.sent else 0.0
    return (
        f"{name:<28} expected {stats.expected:7.0f}  sent {stats.sent:6d}  "
        f"sent/expected {ratio:5.3f}  send lag mean {mean_lag * 1000:6.1f} ms "
        f"max {stats.lag_max_s * 1000:7.1f} ms"
    )


async def run(seconds: float) -> None:
    runner, url = await _ok_server()
    runs: list[tuple[str, RateProfile, float]] = [
        ("constant 150 req/s", ConstantProfile(150.0), 1.0),
        ("constant 600 req/s", ConstantProfile(600.0), 1.0),
        ("diurnal 20-200 at speed 10", DiurnalProfile(200, 20, peak_hour=12, day_s=60.0), 10.0),
    ]
    try:
        print("driver pacing (loopback server answering at once)")
        for name, profile, speed in runs:
            config = DriverConfig(target=url, duration_s=seconds, speed=speed, seed=1)
            print(_line(name, await drive(profile, config)))
    finally:
        await runner.cleanup()
    app_config = SampleAppConfig(
        app="bench", capacity_rps=40, service_time_s=0.05, latency_target_s=0.2
    )
    app_runner, port = await start_sample_app(app_config)
    try:
        config = DriverConfig(target=f"http://127.0.0.1:{port}/", duration_s=seconds, seed=1)
        stats = await drive(ConstantProfile(100.0), config)
    finally:
        await app_runner.cleanup()
    served = stats.succeeded / max(stats.elapsed_s, 1e-9)
    print(
        f"sample app: offered 100 req/s to capacity {app_config.capacity_rps:.0f} req/s: "
        f"served {served:.1f} req/s ({served / app_config.capacity_rps:.2f} of capacity), "
        f"shed {stats.failures.get('503', 0)}, p99 {stats.percentile(0.99) or 0:.3f} s"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=6.0, help="length of each run")
    args = parser.parse_args(argv)
    asyncio.run(run(args.seconds))
    return 0


if __name__ == "__main__":
    sys.exit(main())
