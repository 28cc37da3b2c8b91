"""What the bus's security costs a local start, and how soon a TLS mistake is reported.

Run: .venv/bin/python tests/benchmarks/bench_bus_security.py [--starts N]
(or through pytest: .venv/bin/pytest -s tests/benchmarks/bench_bus_security.py). Prints the
median start of the embedded nats-server (to JetStream healthy) without provisioning (the
baseline), provisioning itself, with per-role logins, and with logins and TLS, each with its
ratio to the baseline measured in the same run; then how long a client without the server's
CA takes to fail (goal: at once, far below the 30 s connect timeout).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from tideshift.services.common.bus import Bus
from tideshift.services.common.bus.connect import NatsTlsError
from tideshift.services.common.embedded_nats import EmbeddedNats
from tideshift.services.devcluster.pki import CertificateAuthority


def median_start(starts: int, **options: Any) -> float:
    seconds = []
    for _ in range(starts):
        begun = time.perf_counter()
        server = EmbeddedNats(**options).start()
        seconds.append(time.perf_counter() - begun)
        server.stop()
    return statistics.median(seconds)


async def refusal_seconds(server: EmbeddedNats) -> tuple[float, str]:
    begun = time.perf_counter()
    try:
        bus = await Bus.connect(
            server.url,
            name="bench",
            user="planner",
            password=server.passwords["planner"],
            connect_timeout=30,
        )
    except NatsTlsError as error:
        return time.perf_counter() - begun, str(error)
    await bus.close()
    raise AssertionError("a client without the CA connected")


def run(starts: int) -> None:
    directory = Path(tempfile.mkdtemp(prefix="bench-bus-security-"))
    authority = CertificateAuthority("bench-ca")
    cert, key = authority.issue_server("nats", dns_names=["localhost"], ips=["127.0.0.1"]).write(
        directory, "server"
    )
    baseline = median_start(starts, provision=False)
    rows = [
        ("no provisioning (baseline)", baseline),
        ("provisions itself", median_start(starts)),
        ("logins (--auth)", median_start(starts, auth=True)),
        ("logins and TLS", median_start(starts, auth=True, tls_cert=cert, tls_key=key)),
    ]
    print(f"embedded nats-server start, median of {starts}:")
    for name, seconds in rows:
        print(f"  {name:28} {seconds:6.3f} s  x{seconds / baseline:4.1f}")
    with EmbeddedNats(auth=True, tls_cert=cert, tls_key=key) as server:
        seconds, message = asyncio.run(refusal_seconds(server))
    verdict = "met" if seconds < 3 else "NOT met"
    print(f"client without the CA refused after {seconds:.3f} s (goal < 3 s: {verdict})")
    print(f"  {message}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--starts", type=int, default=5, help="starts per row (default 5)")
    arguments = parser.parse_args()
    if arguments.starts < 1:
        parser.error("--starts: expected at least 1")
    run(arguments.starts)
    return 0


if __name__ == "__main__":
    sys.exit(main())
