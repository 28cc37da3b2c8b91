"""A service SIGKILLed while running its embedded nats-server takes the server with it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

WAIT = 30.0


def _children(pid: int) -> list[int]:
    path = Path(f"/proc/{pid}/task/{pid}/children")
    return [int(child) for child in path.read_text().split()] if path.exists() else []


def _alive(pid: int) -> bool:
    """Running, not a zombie (a zombie is dead but not yet reaped by its new parent)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    state = next(line for line in status.splitlines() if line.startswith("State:"))
    return "zombie" not in state


def _nats_child(pid: int) -> int | None:
    for child in _children(pid):
        try:
            if Path(f"/proc/{child}/exe").resolve().name == "nats-server":
                return child
        except OSError:
            continue
    return None


def test_sigkilled_service_leaves_no_nats_server_behind(tmp_path: Path) -> None:
    tideshift = Path(sys.executable).parent / "tideshift"
    with (tmp_path / "planner.log").open("wb") as log:
        service = subprocess.Popen(
            [str(tideshift), "run", "planner", "--health-port", "-1"],
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=tmp_path,
            env={key: value for key, value in os.environ.items() if key != "TIDESHIFT_NATS_URL"},
        )
    try:
        deadline = time.monotonic() + WAIT
        server = None
        while server is None and time.monotonic() < deadline and service.poll() is None:
            server = _nats_child(service.pid)
            time.sleep(0.05)
        assert server is not None, (tmp_path / "planner.log").read_text()[-2000:]
        service.send_signal(signal.SIGKILL)
        service.wait(WAIT)
        deadline = time.monotonic() + WAIT
        while _alive(server) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _alive(server), "the embedded nats-server outlived its SIGKILLed parent"
    finally:
        if service.poll() is None:
            service.kill()
            service.wait()
