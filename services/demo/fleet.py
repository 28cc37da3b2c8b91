"""Real training processes behind the simulated pods.

Each elastic job gets a real coordinator and real parameter servers (`tideshift run coordinator`,
`tideshift run pserver`) for the whole run, and one real `tideshift run trainer` process per
trainer pod the cluster reports ready. When the cluster deletes a trainer pod (the planner shrank
the job, or serving preempted it), the process gets SIGTERM, as the kubelet would send, and
finishes or hands back its shard inside its grace period. So the trainers really join and leave
mid-epoch, and the job's progress shows whether that loses work.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import signal
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from tideshift.services.trainer.core.model import DatasetSpec, dataset_uris

log = logging.getLogger("tideshift.demo.fleet")
# One batch per shard: a pull and a push per task, light beside the control loops.
DEMO_DATASET = DatasetSpec(num_shards=48, samples_per_shard=1000, batch_size=1000)
STOP_GRACE_S = 15.0
TRAINING_NICENESS = 10


def _lower_priority() -> None:
    with contextlib.suppress(OSError):
        os.nice(TRAINING_NICENESS)


@dataclass
class ManagedProcess:
    name: str
    argv: list[str]
    log_path: Path
    process: asyncio.subprocess.Process | None = None
    log_file: IO[bytes] | None = None
    stopping: bool = False

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.returncode is None


@dataclass
class TrainingFleet:
    """Starts and stops the real processes; `reconcile` follows the cluster's ready trainers."""

    nats_url: str
    log_dir: Path
    min_task_seconds: float = 1.0
    coordinator_args: Sequence[str] = ("--dataset", json.dumps(dataset_uris(DEMO_DATASET)))
    data_dir: Path | None = None
    processes: dict[str, ManagedProcess] = field(default_factory=dict)
    started: int = 0
    stopped: int = 0
    crashed: int = 0

    def _environment(self) -> dict[str, str]:
        # Children run this interpreter, so they import the same installed `tideshift`.
        return {**os.environ, "PYTHONUNBUFFERED": "1"}

    def _command(self, service: str, job: str, extra: Iterable[str]) -> list[str]:
        return [
            sys.executable,
            "-m",
            "tideshift.services.cli",
            "run",
            service,
            "--job",
            job,
            "--nats-url",
            self.nats_url,
            "--health-port",
            "-1",
            "--log-level",
            "INFO",
            *extra,
        ]

    async def _start(self, name: str, argv: list[str]) -> None:
        self.log_dir.mkdir(parents=True, exist_ok=True)
        managed = ManagedProcess(name, argv, self.log_dir / f"{name}.log")
        managed.log_file = managed.log_path.open("ab")
        managed.process = await asyncio.create_subprocess_exec(
            *argv,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=managed.log_file,
            stderr=managed.log_file,
            env=self._environment(),
            # Training is the best-effort tier here as in the cluster: on a busy machine the
            # control loops (this process) must not wait behind a dozen trainers.
            preexec_fn=_lower_priority,
        )
        self.processes[name] = managed
        self.started += 1

    async def start_job(self, job: str, *, pservers: int) -> None:
        """The job's coordinator and parameter servers (they live for the whole run)."""
        extra = [*self.coordinator_args, "--pservers", str(pservers), "--instance", job]
        await self._start(f"{job}-coordinator", self._command("coordinator", job, extra))
        for index in range(pservers):
            name = f"{job}-pserver-{index}"
            await self._start(
                name,
                self._command("pserver", job, ["--index", str(index), "--instance", name]),
            )

    async def reconcile(self, job: str, ready_trainer_pods: Iterable[str]) -> None:
        """One trainer process per ready trainer pod of `job`, no more."""
        wanted = set(ready_trainer_pods)
        prefix = f"{job}-trainer:"
        current = {
            name[len(prefix) :]: managed
            for name, managed in self.processes.items()
            if name.startswith(prefix) and not managed.stopping
        }
        for pod, managed in current.items():
            if pod not in wanted:
                self._terminate(managed)
        for pod in sorted(wanted - set(current)):
            await self._start(
                prefix + pod,
                self._command(
                    "trainer",
                    job,
                    ["--instance", pod, "--min-task-seconds", str(self.min_task_seconds)],
                ),
            )

    def _terminate(self, managed: ManagedProcess) -> None:
        managed.stopping = True
        if managed.running and managed.process is not None:
            with contextlib.suppress(ProcessLookupError):
                managed.process.send_signal(signal.SIGTERM)

    def reap(self) -> None:
        """Forget processes that exited; count the ones that exited on their own as crashed."""
        for name, managed in list(self.processes.items()):
            if managed.process is None or managed.process.returncode is None:
                continue
            if managed.stopping:
                self.stopped += 1
            else:
                self.crashed += 1
                log.warning(
                    "%s exited with code %s (log: %s)",
                    name,
                    managed.process.returncode,
                    managed.log_path,
                )
            if managed.log_file is not None:
                managed.log_file.close()
            del self.processes[name]

    def live_trainers(self, job: str) -> int:
        prefix = f"{job}-trainer:"
        return sum(
            1
            for name, managed in self.processes.items()
            if name.startswith(prefix) and managed.running and not managed.stopping
        )

    async def stop_all(self) -> None:
        """SIGTERM everything (trainers first, so they hand back shards), then wait, then kill."""
        trainers = [m for n, m in self.processes.items() if "-trainer:" in n]
        others = [m for n, m in self.processes.items() if "-trainer:" not in n]
        for group in (trainers, others):
            for managed in group:
                self._terminate(managed)
            waits = [m.process.wait() for m in group if m.process is not None and m.running]
            if waits:
                _, pending = await asyncio.wait(
                    [asyncio.ensure_future(w) for w in waits], timeout=STOP_GRACE_S
                )
                for managed in group:
                    if managed.running and managed.process is not None:
                        with contextlib.suppress(ProcessLookupError):
                            managed.process.kill()
                        await managed.process.wait()
                for future in pending:
                    future.cancel()
        self.reap()
