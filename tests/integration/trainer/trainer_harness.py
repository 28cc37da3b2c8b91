"""Start, stop and kill a training job's processes (`tideshift run ...` or a user's script),
and read what its pservers applied.

Shared by the trainer integration tests and the trainer benchmark. Every wait is bounded.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

from tideshift.services.common.bus import Bus, RequestFailed
from tideshift.services.trainer.core.jobspec import JobSpec
from tideshift.services.trainer.port.jobs import read_layout, read_spec
from tideshift.services.trainer.port.pserver_client import PServerClient

REPO = Path(__file__).resolve().parents[3]


@dataclass
class ServiceProcess:
    name: str
    args: list[str]
    env: dict[str, str]
    log_dir: Path
    popen: subprocess.Popen[bytes] | None = None
    starts: int = 0
    script: Path | None = None  # a user's trainer script instead of `tideshift run ...`

    @property
    def stdout_path(self) -> Path:
        return self.log_dir / f"{self.name}.{self.starts}.out"

    @property
    def stderr_path(self) -> Path:
        return self.log_dir / f"{self.name}.{self.starts}.err"

    def start(self) -> ServiceProcess:
        self.starts += 1
        with self.stdout_path.open("wb") as out, self.stderr_path.open("wb") as err:
            command = (
                [sys.executable, str(self.script), *self.args]
                if self.script is not None
                else [sys.executable, "-m", "tideshift.services.cli", "run", *self.args]
            )
            self.popen = subprocess.Popen(
                command,
                cwd=REPO,
                env=self.env,
                stdout=out,
                stderr=err,
            )
        return self

    @property
    def running(self) -> bool:
        return self.popen is not None and self.popen.poll() is None

    def signal(self, signum: int) -> None:
        if self.running:
            assert self.popen is not None
            self.popen.send_signal(signum)

    async def wait(self, timeout: float) -> int:
        """The exit code; raises TimeoutError (after killing it) if it does not exit."""
        assert self.popen is not None
        deadline = time.monotonic() + timeout
        while self.popen.poll() is None:
            if time.monotonic() > deadline:
                self.popen.kill()
                self.popen.wait(5)
                raise TimeoutError(f"{self.name} did not exit within {timeout}s\n{self.tail()}")
            await asyncio.sleep(0.05)
        return int(self.popen.returncode)

    async def terminate(self, timeout: float = 25.0) -> int:
        self.signal(signal.SIGTERM)
        return await self.wait(timeout)

    async def kill(self) -> int:
        self.signal(signal.SIGKILL)
        return await self.wait(10.0)

    def stdout(self) -> str:
        return self.stdout_path.read_text()

    def tail(self, lines: int = 15) -> str:
        try:
            text = self.stderr_path.read_text().splitlines()
        except FileNotFoundError:
            return ""
        return "\n".join(text[-lines:])

    def summary(self) -> dict[str, object]:
        """The coordinator's JSON summary: its last stdout line."""
        lines = [line for line in self.stdout().splitlines() if line.strip()]
        assert lines, f"{self.name} printed nothing on stdout\n{self.tail()}"
        result: dict[str, object] = json.loads(lines[-1])
        return result


@dataclass
class JobHarness:
    nats_url: str
    job: str
    log_dir: Path
    coordinator_args: list[str] = field(default_factory=list)
    pserver_args: list[str] = field(default_factory=list)
    trainer_args: list[str] = field(default_factory=list)
    processes: dict[str, ServiceProcess] = field(default_factory=dict)

    def _env(self) -> dict[str, str]:
        env = dict(os.environ)
        env.update(
            {
                "TIDESHIFT_NATS_URL": self.nats_url,
                "TIDESHIFT_HEALTH_PORT": "-1",
                "TIDESHIFT_LOG_LEVEL": "INFO",
            }
        )
        return env

    def process(self, name: str, args: list[str]) -> ServiceProcess:
        if name not in self.processes:
            self.processes[name] = ServiceProcess(name, args, self._env(), self.log_dir)
        return self.processes[name]

    def coordinator(self) -> ServiceProcess:
        return self.process(
            "coordinator",
            ["coordinator", "--job", self.job, "--instance", "coordinator", *self.coordinator_args],
        )

    def pserver(self, index: int = 0) -> ServiceProcess:
        return self.process(
            f"pserver-{index}",
            ["pserver", "--job", self.job, "--index", str(index), *self.pserver_args],
        )

    def trainer(self, name: str) -> ServiceProcess:
        return self.process(
            name, ["trainer", "--job", self.job, "--instance", name, *self.trainer_args]
        )

    def script(self, name: str, script: Path, args: list[str]) -> ServiceProcess:
        """A user's trainer script joining the job (job name and NATS from the environment)."""
        if name not in self.processes:
            env = {**self._env(), "TIDESHIFT_JOB": self.job, "TIDESHIFT_INSTANCE": name}
            self.processes[name] = ServiceProcess(name, args, env, self.log_dir, script=script)
        return self.processes[name]

    def live_trainers(self) -> list[ServiceProcess]:
        return [p for n, p in self.processes.items() if n.startswith("t") and p.running]

    async def stop_all(self, timeout: float = 25.0) -> dict[str, int]:
        """SIGTERM everything still running; name -> exit code."""
        running = [p for p in self.processes.values() if p.running]
        for process in running:
            process.signal(signal.SIGTERM)
        codes = await asyncio.gather(*(p.wait(timeout) for p in running), return_exceptions=True)
        return {
            p.name: c if isinstance(c, int) else -999 for p, c in zip(running, codes, strict=True)
        }

    def kill_all(self) -> None:
        for process in self.processes.values():
            if process.running and process.popen is not None:
                process.popen.kill()
                process.popen.wait(5)


def training(url: str, *args: str) -> subprocess.CompletedProcess[str]:
    """`tideshift training ARGS --nats-url URL`, as a user runs it."""
    return subprocess.run(
        [sys.executable, "-m", "tideshift.services.cli", "training", *args, "--nats-url", url],
        cwd=REPO, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip


async def wait_until(
    condition: Callable[[], Awaitable[bool]],
    *,
    timeout: float,
    what: str,
    every: float = 0.1,
    explain: Callable[[], str] | None = None,
) -> None:
    """Wait for `condition`; TimeoutError naming `what`, plus `explain()` (say, the logs of
    the processes involved) when given."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if await condition():
            return
        await asyncio.sleep(every)
    details = f"\n{explain()}" if explain is not None else ""
    raise TimeoutError(f"timed out after {timeout}s waiting for {what}{details}")


async def spec_of(bus: Bus, job: str) -> JobSpec:
    spec: JobSpec | None = None

    async def published() -> bool:
        nonlocal spec
        spec = await read_spec(bus, job)
        return spec is not None

    await wait_until(published, timeout=60, what=f"job {job}'s spec")
    assert spec is not None
    return spec


async def client_of(bus: Bus, job: str, timeout: float = 2.0) -> PServerClient:
    """A client once the spec and the model layout (written by the first trainer) exist."""
    spec = await spec_of(bus, job)
    layout = None

    async def initialised() -> bool:
        nonlocal layout
        layout = await read_layout(bus, spec)
        return layout is not None

    await wait_until(initialised, timeout=60, what=f"job {job}'s layout")
    assert layout is not None
    return PServerClient(bus, spec, layout, timeout=timeout)


async def applied_total(client: PServerClient) -> int | None:
    """Batches applied on every pserver, or None while one restarts."""
    try:
        return min(status.version for status in await client.status())
    except RequestFailed:
        return None


async def wait_applied(client: PServerClient, at_least: int, timeout: float = 120) -> None:
    async def reached() -> bool:
        count = await applied_total(client)
        return count is not None and count >= at_least

    await wait_until(reached, timeout=timeout, what=f"{at_least} applied batches", every=0.1)


async def assert_exactly_once(
    client: PServerClient, *, epochs: int, shards: int, batches: int
) -> list[int]:
    """Every pserver finished every epoch with exactly one apply per (epoch, shard, batch);
    returns the duplicates each refused."""
    statuses = await client.status(from_epoch=epochs)
    for status in statuses:
        assert status.watermark == epochs
        assert status.version == epochs * shards * batches
    return [status.duplicates for status in statuses]


def one_shard_job(nats_url: str, job: str, log_dir: Path) -> JobHarness:
    """A one-epoch job of a single shard on two pservers with plain SGD: the smallest job in
    which a batch is split over pservers."""
    return JobHarness(
        nats_url,
        job,
        log_dir,
        coordinator_args=[
            "--epochs", "1", "--dataset", json.dumps(["only-shard"]), "--pservers", "2",
            "--optimizer", json.dumps({"kind": "sgd", "learning_rate": 0.5}),
        ],
    )  # fmt: skip
