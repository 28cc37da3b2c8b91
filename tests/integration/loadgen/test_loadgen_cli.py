"""`tideshift loadgen` and `tideshift serve-sample` as a person runs them."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
ENV = dict(os.environ)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture
def sample_app() -> Iterator[int]:
    port = _free_port()
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tideshift.services.cli",
            "serve-sample",
            "--port",
            str(port),
            "--capacity-rps",
            "500",
            "--app",
            "shop",
        ],
        env=ENV,
        cwd=REPO,
        stderr=subprocess.PIPE,
    )
    deadline = time.monotonic() + 60
    while True:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=1):
                break
        except OSError:
            assert process.poll() is None, process.stderr.read() if process.stderr else ""
            assert time.monotonic() < deadline, "sample app did not start"
            time.sleep(0.2)
    try:
        yield port
    finally:
        process.terminate()
        assert process.wait(10) == 0  # SIGTERM is a clean exit


def test_trace_replay_through_the_cli(sample_app: int, tmp_path: Path) -> None:
    # Three trace minutes: 600, 1200, 600 requests; compressed 60x each lasts one second, and
    # --peak-rps 80 scales the busiest minute to 80 req/s: 40, 80, 40 req/s.
    trace = tmp_path / "trace.csv"
    trace.write_text("timestamp_s,requests\n0,600\n60,1200\n120,600\n")
    report = tmp_path / "report.json"
    completed = subprocess.run(
        [
            sys.executable,
            "-m",
            "tideshift.services.cli",
            "loadgen",
            "--target",
            f"http://127.0.0.1:{sample_app}/",
            "--trace",
            str(trace),
            "--speed",
            "60",
            "--duration",
            "3",
            "--peak-rps",
            "80",
            "--report",
            str(report),
        ],
        env=ENV,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert completed.returncode == 0, completed.stderr
    figures = json.loads(report.read_text())
    assert figures["expected"] == pytest.approx(160, rel=0.05)
    # Late arrivals still leave (a busy machine shows as send lag), so what is offered is the
    # seeded schedule's count whatever the machine's speed; every request sent was served.
    assert figures["offered"] == pytest.approx(figures["expected"], rel=0.15)
    assert figures["succeeded"] == figures["sent"] == figures["offered"]
    assert figures["send_lag_s"]["max"] >= 0
    assert figures["latency_s"]["p50"] is not None
    with urllib.request.urlopen(f"http://127.0.0.1:{sample_app}/metrics", timeout=5) as answer:
        metrics = answer.read().decode()
    assert f'http_requests_total{{app="shop",code="200"}} {float(figures["succeeded"])}' in metrics


def test_cli_reports_a_bad_trace_line(tmp_path: Path) -> None:
    trace = tmp_path / "trace.csv"
    trace.write_text("timestamp_s,requests\n0,1\n60,x\n")
    completed = subprocess.run(
        [
            sys.executable,
            "-m",
            "tideshift.services.cli",
            "loadgen",
            "--target",
            "http://127.0.0.1:9/",
            "--trace",
            str(trace),
            "--duration",
            "1",
        ],
        env=ENV,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert completed.returncode == 2
    assert "line 3" in completed.stderr
