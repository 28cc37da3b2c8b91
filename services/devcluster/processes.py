"""The control plane's child processes: which still run, how to stop them, the state file that
records them for a later command; and waiting on a condition with a deadline. Blocking."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

STATE_FILE = "state.json"


@dataclass(frozen=True)
class ProcessRecord:
    name: str
    pid: int
    binary: str
    log: str


def pid_alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    # Field 3, after the parenthesised command name, is the state; zombies are dead.
    return stat.rsplit(")", 1)[1].split()[0] not in {"Z", "X"}


def record_alive(record: ProcessRecord) -> bool:
    """The recorded process still runs (and its pid was not recycled by another program)."""
    return pid_alive(record.pid) and runs_binary(record.pid, record.binary)


def runs_binary(pid: int, binary: str) -> bool:
    """Guards against signalling a recycled pid that now belongs to something else."""
    try:
        return os.path.realpath(f"/proc/{pid}/exe") == os.path.realpath(binary)
    except OSError:
        return False


def log_tail(path: Path, lines: int = 25) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def wait_for(
    predicate: Callable[[], bool], *, timeout: float, what: str, interval: float = 0.2
) -> None:
    """Polls `predicate` until true; TimeoutError naming `what` after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(interval)


def terminate_processes(
    records: Sequence[ProcessRecord],
    popens: Mapping[str, subprocess.Popen[bytes]] | None = None,
    *,
    grace: float = 10.0,
) -> list[str]:
    """TERM every process group, KILL what is left after `grace`; returns the names stopped."""
    popens = popens or {}

    def alive(record: ProcessRecord) -> bool:
        process = popens.get(record.name)
        if process is not None:
            return process.poll() is None
        return pid_alive(record.pid)

    targets = [
        record
        for record in reversed(records)
        if alive(record) and (record.name in popens or runs_binary(record.pid, record.binary))
    ]
    for record in targets:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(record.pid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while any(alive(record) for record in targets) and time.monotonic() < deadline:
        time.sleep(0.05)
    for record in targets:
        # The whole group, in case a component left children behind.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(record.pid, signal.SIGKILL)
    kill_deadline = time.monotonic() + 5.0
    while any(alive(record) for record in targets) and time.monotonic() < kill_deadline:
        time.sleep(0.05)
    return [record.name for record in targets]


def load_state(state_dir: Path) -> dict[str, Any] | None:
    try:
        state: dict[str, Any] = json.loads((state_dir / STATE_FILE).read_text())
    except (OSError, ValueError):
        return None
    return state


def state_processes(state: Mapping[str, Any]) -> list[ProcessRecord]:
    return [ProcessRecord(**record) for record in state.get("processes", [])]
