"""Training jobs against a real nats-server: convergence, chaos, bad input.

Processes are the real CLI (`python -m services.cli run coordinator|pserver|trainer`). Chaos
steps are triggered by training progress (applied shards), never by fixed sleeps.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import pytest
from trainer_harness import JobHarness, wait_until

from tideshift.events import SHARD_TASK, TRAINER_MEMBERSHIP, ShardTask
from tideshift.services.common.bus import Bus, RequestFailed
from tideshift.services.common.embedded_nats import EmbeddedNats
from tideshift.services.trainer.busport import pserver_subject
from tideshift.services.trainer.jobs import read_spec
from tideshift.services.trainer.jobspec import JobSpec
from tideshift.services.trainer.model import (
    DatasetSpec,
    generate_holdout,
    ground_truth,
    log_loss,
    train_serially,
)
from tideshift.services.trainer.pserver_client import PServerClient
from tideshift.services.trainer.wire import pack, unpack

pytestmark = pytest.mark.timeout(420)


def dataset(shards: int, samples: int, holdout: int) -> DatasetSpec:
    return DatasetSpec(
        seed=7, num_shards=shards, samples_per_shard=samples, holdout_samples=holdout
    )


def job_args(tmp_path: Path, *, epochs: int, shards: int, samples: int, holdout: int) -> list[str]:
    return [
        "--epochs", str(epochs), "--shards", str(shards),
        "--samples-per-shard", str(samples), "--holdout-samples", str(holdout),
        "--data-dir", str(tmp_path / "data"),
    ]  # fmt: skip


async def spec_of(bus: Bus, job: str) -> JobSpec:
    spec: JobSpec | None = None

    async def published() -> bool:
        nonlocal spec
        spec = await read_spec(bus, job)
        return spec is not None

    await wait_until(published, timeout=60, what=f"job {job}'s spec")
    assert spec is not None
    return spec


async def applied_total(client: PServerClient) -> int | None:
    try:
        return min(status.applied_total for status in await client.status())
    except RequestFailed:
        return None  # a pserver is restarting


async def wait_applied(client: PServerClient, at_least: int, timeout: float = 120) -> None:
    async def reached() -> bool:
        count = await applied_total(client)
        return count is not None and count >= at_least

    await wait_until(reached, timeout=timeout, what=f"{at_least} applied shards", every=0.1)


async def assert_exactly_once(client: PServerClient, *, epochs: int, shards: int) -> None:
    everything = {(epoch, shard) for epoch in range(epochs) for shard in range(shards)}
    for status in await client.status():
        assert status.applied == everything
        # version counts applies since the start; equal to the set size means no double apply
        assert status.version == epochs * shards


async def collect_membership(bus: Bus, job: str, into: list[tuple[str, str]]) -> None:
    async for envelope in bus.subscribe(TRAINER_MEMBERSHIP.filter(job=job), consumer="test"):
        into.append((envelope.data.trainer, envelope.data.change))


async def test_fixed_trainers_converge_near_ground_truth(
    bus: Bus, nats_server: EmbeddedNats, tmp_path: Path, unique: str
) -> None:
    epochs, shards, samples, holdout = 3, 16, 2000, 10000
    harness = JobHarness(
        nats_server.url,
        f"fixed-{unique}",
        tmp_path,
        coordinator_args=[
            *job_args(tmp_path, epochs=epochs, shards=shards, samples=samples, holdout=holdout),
            "--pservers",
            "2",
        ],
    )
    members: list[tuple[str, str]] = []
    listener = asyncio.create_task(collect_membership(bus, harness.job, members))
    try:
        harness.pserver(0).start()
        harness.pserver(1).start()
        for name in ("t1", "t2", "t3"):
            harness.trainer(name).start()
        coordinator = harness.coordinator().start()
        assert await coordinator.wait(240) == 0, coordinator.tail()
        summary = coordinator.summary()
        assert {k: summary[k] for k in ("epochs", "shards", "applied")} == {
            "epochs": epochs,
            "shards": shards,
            "applied": epochs * shards,
        }
        data = dataset(shards, samples, holdout)
        held_out = generate_holdout(data)
        reference = log_loss(train_serially(data, epochs=epochs), held_out)
        truth = log_loss(ground_truth(data), held_out)
        logloss = float(summary["logloss"])  # type: ignore[arg-type]
        assert abs(logloss - reference) < 0.01
        assert truth < logloss < truth + 0.03
        client = PServerClient(bus, await spec_of(bus, harness.job))
        await assert_exactly_once(client, epochs=epochs, shards=shards)
        codes = await harness.stop_all()
        assert codes == dict.fromkeys(codes, 0)

        async def all_left() -> bool:
            return {(n, "left") for n in ("t1", "t2", "t3")} <= set(members)

        await wait_until(all_left, timeout=10, what="left events")
        assert {(n, "joined") for n in ("t1", "t2", "t3")} <= set(members)
    finally:
        listener.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await listener
        harness.kill_all()


async def test_chaos_every_shard_applied_exactly_once(
    bus: Bus, nats_server: EmbeddedNats, tmp_path: Path, unique: str
) -> None:
    """Add trainers, SIGTERM some, SIGKILL others, restart the pserver and the coordinator."""
    epochs, shards, samples, holdout = 6, 24, 2000, 10000
    total = epochs * shards
    harness = JobHarness(
        nats_server.url,
        f"chaos-{unique}",
        tmp_path,
        coordinator_args=[
            *job_args(tmp_path, epochs=epochs, shards=shards, samples=samples, holdout=holdout),
            "--ack-wait-seconds",
            "2",
        ],
        pserver_args=["--checkpoint-seconds", "1"],
        trainer_args=["--min-task-seconds", "0.3", "--grace-seconds", "5"],
    )
    members: list[tuple[str, str]] = []
    listener = asyncio.create_task(collect_membership(bus, harness.job, members))
    exits: dict[str, int] = {}
    try:
        harness.pserver().start()
        harness.trainer("t1").start()
        harness.trainer("t2").start()
        harness.coordinator().start()
        client = PServerClient(bus, await spec_of(bus, harness.job), timeout=2.0)

        await wait_applied(client, total // 12)
        harness.trainer("t3").start()
        harness.trainer("t4").start()

        await wait_applied(client, total * 2 // 12)
        exits["t1 SIGTERM"] = await harness.trainer("t1").terminate()

        await wait_applied(client, total * 3 // 12)
        exits["t2 SIGKILL"] = await harness.trainer("t2").kill()

        async def t2_crash_reported() -> bool:
            return ("t2", "crashed") in members

        # The coordinator reports the crash once t2's member key expires (about 6 s).
        await wait_until(t2_crash_reported, timeout=30, what="t2's crash event")

        await wait_applied(client, total * 5 // 12)
        exits["pserver SIGTERM"] = await harness.pserver().terminate()
        harness.pserver().start()

        await wait_applied(client, total * 7 // 12)
        exits["coordinator SIGTERM"] = await harness.coordinator().terminate()
        harness.coordinator().start()

        await wait_applied(client, total * 9 // 12)
        exits["t3 SIGKILL"] = await harness.trainer("t3").kill()
        harness.trainer("t5").start()

        await wait_applied(client, total * 10 // 12)
        exits["t4 SIGTERM"] = await harness.trainer("t4").terminate()

        coordinator = harness.coordinator()
        assert await coordinator.wait(240) == 0, coordinator.tail()
        assert exits == {
            "t1 SIGTERM": 0,
            "t2 SIGKILL": -signal.SIGKILL,
            "pserver SIGTERM": 0,
            "coordinator SIGTERM": 0,
            "t3 SIGKILL": -signal.SIGKILL,
            "t4 SIGTERM": 0,
        }
        summary = coordinator.summary()
        assert summary["applied"] == total
        await assert_exactly_once(client, epochs=epochs, shards=shards)
        data = dataset(shards, samples, holdout)
        reference = log_loss(train_serially(data, epochs=epochs), generate_holdout(data))
        assert abs(float(summary["logloss"]) - reference) < 0.01  # type: ignore[arg-type]
        assert int(summary["redelivered"]) >= 1  # type: ignore[call-overload]
        codes = await harness.stop_all()
        assert codes == dict.fromkeys(codes, 0), codes
        changes = set(members)
        assert {("t1", "left"), ("t4", "left"), ("t5", "joined")} <= changes
        assert ("t1", "crashed") not in changes  # a graceful leave is not a crash
    finally:
        listener.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await listener
        harness.kill_all()


async def test_pserver_killed_loses_only_unsaved_work_which_is_redone(
    bus: Bus, nats_server: EmbeddedNats, tmp_path: Path, unique: str
) -> None:
    """SIGKILL skips the final checkpoint: acked shards vanish and must be published again."""
    epochs, shards = 3, 16
    harness = JobHarness(
        nats_server.url,
        f"pskill-{unique}",
        tmp_path,
        coordinator_args=[
            *job_args(tmp_path, epochs=epochs, shards=shards, samples=1000, holdout=5000),
            "--ack-wait-seconds",
            "2",
        ],
        pserver_args=["--checkpoint-seconds", "30"],  # no checkpoint before the kill
        trainer_args=["--min-task-seconds", "0.1"],
    )
    try:
        harness.pserver().start()
        harness.trainer("t1").start()
        harness.trainer("t2").start()
        coordinator = harness.coordinator().start()
        client = PServerClient(bus, await spec_of(bus, harness.job), timeout=2.0)
        await wait_applied(client, shards + 4)
        assert await harness.pserver().kill() == -signal.SIGKILL
        harness.pserver().start()
        assert await coordinator.wait(240) == 0, coordinator.tail()
        summary = coordinator.summary()
        assert summary["applied"] == epochs * shards
        assert int(summary["redelivered"]) >= shards  # type: ignore[call-overload]
        await assert_exactly_once(client, epochs=epochs, shards=shards)
        assert "publishing them again" in coordinator.stderr_path.read_text()
    finally:
        await harness.stop_all()
        harness.kill_all()


async def test_bad_input_rejected_with_reason_and_parameters_untouched(
    bus: Bus, nats_server: EmbeddedNats, tmp_path: Path, unique: str
) -> None:
    shards = 4
    harness = JobHarness(
        nats_server.url,
        f"bad-{unique}",
        tmp_path,
        coordinator_args=job_args(tmp_path, epochs=1, shards=shards, samples=500, holdout=2000),
    )
    try:
        harness.pserver().start()
        coordinator = harness.coordinator().start()
        spec = await spec_of(bus, harness.job)
        client = PServerClient(bus, spec, timeout=2.0)
        await wait_until(
            lambda: _answers(client), timeout=60, what="the pserver to answer", every=0.2
        )
        before = await client.pull()
        subject = pserver_subject(harness.job, 0, "push")
        size = spec.key_ranges[0].size

        def push(gradient: np.ndarray, **header: object) -> bytes:
            fields: dict[str, object] = {
                "job": harness.job, "epoch": 0, "shard": 0, "delivery": 1,
                "start": 0, "stop": size, "trainer": "test",
            }  # fmt: skip
            fields.update(header)
            return pack(fields, {"gradient": gradient})

        nan = np.zeros(size)
        nan[3] = np.nan
        cases = [
            (b"\x00\x01garbage", "malformed gradient push"),
            (pack({"job": harness.job}), "missing array 'gradient'"),
            (pack({"job": harness.job}, {"gradient": np.zeros(size)}), "field 'epoch'"),
            (push(np.zeros(size - 1)), f"expected shape ({size},)"),
            (push(nan), "non-finite"),
            (push(np.zeros(size), job="someone-else"), "unknown job 'someone-else'"),
            (push(np.zeros(size), stop=size + 5), "does not match"),
            (push(np.zeros(size), epoch=-2), "must be >= 0"),
            (push(np.zeros(size), shard=shards), f"shard {shards} out of range"),
        ]
        for payload, reason in cases:
            header, _ = unpack(await bus.request(subject, payload, timeout=5))
            assert header["outcome"] == "rejected", (reason, header)
            assert reason in str(header["reason"]), header
        params_reply, _ = unpack(
            await bus.request(pserver_subject(harness.job, 0, "params"), pack({"job": "nope"}))
        )
        assert "unknown job 'nope'" in str(params_reply["error"])
        assert np.array_equal(await client.pull(), before)
        (status,) = await client.status()
        assert status.version == 0 and not status.applied

        # Malformed tasks on the job's queue: another job's, a wrong shard count, not an event.
        task_subject = SHARD_TASK.at(job=harness.job)
        now = datetime.now(UTC)
        await bus.publish_durable(
            task_subject, ShardTask(job="other-job", epoch=0, shard=0, shards=4, issued_at=now)
        )
        await bus.publish_durable(
            task_subject, ShardTask(job=harness.job, epoch=0, shard=0, shards=99, issued_at=now)
        )
        await bus.js.publish(task_subject.value, b"{not an event")
        trainer = harness.trainer("t1").start()
        assert await coordinator.wait(120) == 0, coordinator.tail()
        assert coordinator.summary()["applied"] == shards
        await assert_exactly_once(client, epochs=1, shards=shards)
        assert await trainer.terminate() == 0
        log = trainer.stderr_path.read_text()
        assert "unknown job 'other-job'" in log
        assert "task says 99 shards per epoch" in log
    finally:
        await harness.stop_all()
        harness.kill_all()


async def _answers(client: PServerClient) -> bool:
    return await applied_total(client) is not None


async def test_long_shards_heartbeat_and_sigterm_naks_within_grace(
    bus: Bus, nats_server: EmbeddedNats, tmp_path: Path, unique: str
) -> None:
    """Tasks take 2.5x the ack wait: heartbeats keep them from being redelivered. A trainer
    whose grace period is shorter than its task naks it and exits 0 promptly."""
    shards = 6
    harness = JobHarness(
        nats_server.url,
        f"long-{unique}",
        tmp_path,
        coordinator_args=[
            *job_args(tmp_path, epochs=1, shards=shards, samples=500, holdout=2000),
            "--ack-wait-seconds",
            "1",
        ],
        trainer_args=["--min-task-seconds", "2.5", "--grace-seconds", "0.5"],
    )
    try:
        harness.pserver().start()
        harness.trainer("t1").start()
        harness.trainer("t2").start()
        coordinator = harness.coordinator().start()
        client = PServerClient(bus, await spec_of(bus, harness.job), timeout=2.0)
        await wait_applied(client, 2)
        # Under load t1 may still be starting: terminate it only once it is mid-task.
        t1_log = harness.trainer("t1").stderr_path

        async def t1_mid_task() -> bool:
            return t1_log.exists() and "computing epoch" in t1_log.read_text()

        await wait_until(t1_mid_task, timeout=60, what="t1 to start a task")
        # Bounded: a trainer that overstays its grace period fails here.
        assert await harness.trainer("t1").terminate(timeout=10) == 0
        harness.trainer("t3").start()
        assert await coordinator.wait(120) == 0, coordinator.tail()
        assert coordinator.summary()["applied"] == shards
        (status,) = await client.status()
        assert status.duplicates == 0  # no shard computed twice: heartbeats held them
        assert status.redelivered <= 1  # at most t1's nak'ed shard
        await assert_exactly_once(client, epochs=1, shards=shards)
        assert "stopping; finishing epoch" in harness.trainer("t1").stderr_path.read_text()
    finally:
        await harness.stop_all()
        harness.kill_all()
