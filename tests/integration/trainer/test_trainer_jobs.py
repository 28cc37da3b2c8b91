"""Training jobs against a real nats-server: convergence, chaos, bad input.

Processes are the real CLI (`python -m services.cli run coordinator|pserver|trainer`). Chaos
steps are triggered by training progress (applied shards), never by fixed sleeps.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import pytest
from trainer_harness import (
    JobHarness,
    ServiceProcess,
    assert_exactly_once,
    client_of,
    spec_of,
    wait_applied,
    wait_until,
)

from tideshift.events import SHARD_TASK, TRAINER_MEMBERSHIP, ShardTask
from tideshift.services.common.bus import Bus
from tideshift.services.common.embedded_nats import EmbeddedNats
from tideshift.services.trainer.core.model import (
    DatasetSpec,
    dataset_uris,
    generate_holdout,
    ground_truth,
    log_loss,
    train_serially,
)
from tideshift.services.trainer.core.wire import pack, unpack
from tideshift.services.trainer.port.bus import pserver_subject
from tideshift.services.trainer.port.pserver_client import PServerClient

pytestmark = pytest.mark.timeout(420)
LEARNING_RATE = 0.3


def dataset(shards: int, samples: int, holdout: int, batch: int = 500) -> DatasetSpec:
    return DatasetSpec(
        seed=7,
        num_shards=shards,
        samples_per_shard=samples,
        holdout_samples=holdout,
        batch_size=batch,
    )


def job_args(data: DatasetSpec, *, epochs: int) -> list[str]:
    return [
        "--epochs", str(epochs), "--dataset", json.dumps(dataset_uris(data)),
        "--optimizer", json.dumps({"kind": "adagrad", "learning_rate": LEARNING_RATE}),
    ]  # fmt: skip


def batches_of(data: DatasetSpec) -> int:
    return -(-data.samples_per_shard // data.batch_size)


async def holdout_loss(client: PServerClient, data: DatasetSpec) -> float:
    return log_loss(await client.pull(), generate_holdout(data))


async def collect_membership(bus: Bus, job: str, into: list[tuple[str, str]]) -> None:
    async for envelope in bus.subscribe(TRAINER_MEMBERSHIP.filter(job=job), consumer="test"):
        into.append((envelope.data.trainer, envelope.data.change))


async def test_fixed_trainers_converge_near_ground_truth(
    bus: Bus, nats_server: EmbeddedNats, tmp_path: Path, unique: str
) -> None:
    epochs, data = 3, dataset(shards=16, samples=2000, holdout=10000)
    harness = JobHarness(
        nats_server.url,
        f"fixed-{unique}",
        tmp_path,
        coordinator_args=[*job_args(data, epochs=epochs), "--pservers", "2"],
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
        total = epochs * data.num_shards * batches_of(data)
        summary = coordinator.summary()
        assert summary["batches_applied"] == [total, total]
        assert summary["duplicates_refused"] == [0, 0]
        client = await client_of(bus, harness.job)
        assert await assert_exactly_once(
            client, epochs=epochs, shards=data.num_shards, batches=batches_of(data)
        ) == [0, 0]
        held_out = generate_holdout(data)
        reference = train_serially(data, epochs=epochs, learning_rate=LEARNING_RATE)
        logloss = await holdout_loss(client, data)
        truth = log_loss(ground_truth(data), held_out)
        assert abs(logloss - log_loss(reference, held_out)) < 0.01
        assert truth < logloss < truth + 0.03
        # The trainers leave on their own once the job is finished.
        for name in ("t1", "t2", "t3"):
            assert await harness.trainer(name).wait(30) == 0, harness.trainer(name).tail()

        async def all_left() -> bool:
            return {(n, "left") for n in ("t1", "t2", "t3")} <= set(members)

        await wait_until(all_left, timeout=10, what="left events")
        assert {(n, "joined") for n in ("t1", "t2", "t3")} <= set(members)
        codes = await harness.stop_all()
        assert codes == dict.fromkeys(codes, 0)
    finally:
        listener.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await listener
        harness.kill_all()


def lease_role(pserver: ServiceProcess) -> str | None:
    """What a pserver of a (job, index) pair last said about the lease: "serving" (it leads),
    "standing by", or None before either."""
    role = None
    for line in pserver.stderr_path.read_text().splitlines():
        if " serving " in line:
            role = "serving"
        elif "standing by" in line:
            role = "standing by"
    return role


async def test_a_standby_pserver_takes_over_and_killed_work_is_redone_once(
    bus: Bus, nats_server: EmbeddedNats, tmp_path: Path, unique: str
) -> None:
    """Two pservers with the same index: one leads, one stands by. SIGKILL the leader (its
    unsaved batches vanish with it): the standby restores the checkpoint and leads, the lost
    batches are trained again, and every batch ends applied exactly once.

    Which of the two leads is read from their logs, not assumed from the start order: with a
    2 s lease on a loaded machine the first one may be slow to take the lease or miss a
    renewal, and the second then leads (correctly); the test once waited for the second to
    stand by while it was serving."""
    epochs, data = 3, dataset(shards=12, samples=1000, holdout=2000, batch=250)
    batches = batches_of(data)
    harness = JobHarness(
        nats_server.url,
        f"standby-{unique}",
        tmp_path,
        coordinator_args=[*job_args(data, epochs=epochs), "--ack-wait-seconds", "2"],
        pserver_args=["--checkpoint-seconds", "30", "--lease-seconds", "2"],
        trainer_args=["--min-task-seconds", "0.2"],
    )
    try:
        pservers = [
            harness.process(name, ["pserver", "--job", harness.job, "--instance", name,
                                   *harness.pserver_args])
            for name in ("p-a", "p-b")
        ]  # fmt: skip
        pservers[0].start()
        harness.trainer("t1").start()
        harness.trainer("t2").start()
        coordinator = harness.coordinator().start()
        client = await client_of(bus, harness.job)
        pservers[1].start()

        async def one_leads_one_stands_by() -> bool:
            return sorted(map(lease_role, pservers), key=str) == ["serving", "standing by"]

        await wait_until(
            one_leads_one_stands_by,
            timeout=120,
            what="one pserver serving and the other standing by",
            explain=lambda: "\n".join(f"{p.name}:\n{p.tail()}" for p in pservers),
        )
        await wait_applied(client, data.num_shards * batches + 4)
        leader, standby = sorted(pservers, key=lambda p: lease_role(p) != "serving")
        assert await leader.kill() == -signal.SIGKILL
        assert await coordinator.wait(240) == 0, coordinator.tail()
        await assert_exactly_once(client, epochs=epochs, shards=data.num_shards, batches=batches)
        assert "restored" in standby.stderr_path.read_text()
        assert "publishing them again" in coordinator.stderr_path.read_text()
    finally:
        await harness.stop_all()
        harness.kill_all()


async def test_bad_input_rejected_with_reason_and_parameters_untouched(
    bus: Bus, nats_server: EmbeddedNats, tmp_path: Path, unique: str
) -> None:
    data = dataset(shards=4, samples=500, holdout=1000)
    harness = JobHarness(
        nats_server.url,
        f"bad-{unique}",
        tmp_path,
        coordinator_args=[*job_args(data, epochs=1), "--ack-wait-seconds", "30"],
    )
    try:
        harness.pserver().start()
        coordinator = harness.coordinator().start()
        harness.trainer("t0").start()  # initialises the model, then trains the four shards
        client = await client_of(bus, harness.job)
        assert await coordinator.wait(120) == 0, coordinator.tail()
        before = await client.pull()
        (weights,) = client.layout.pieces_named("weights")
        subject = pserver_subject(harness.job, 0, "push")

        def push(gradient: np.ndarray, **header: object) -> bytes:
            fields: dict[str, object] = {
                "job": harness.job, "push_id": "test", "epoch": 1, "shard": 0, "batch": 0,
                "last": False, "part": 0, "parts": 1,
                "updates": [{"piece": weights.id, "kind": "dense"}],
            }  # fmt: skip
            fields.update(header)
            return pack(fields, {f"d{weights.id}": gradient})

        size = weights.stop - weights.start
        nan = np.zeros(size)
        nan[3] = np.nan
        cases = [
            (b"\x00\x01garbage", "malformed gradient push"),
            (pack({"job": harness.job}), "field 'push_id'"),
            (push(np.zeros(size), updates=[7]),
             "each entry must be an object"),
            (push(np.zeros(size - 1)), f"expected shape ({size},)"),
            (push(nan), "non-finite"),
            (push(np.zeros(size), job="someone-else"), "unknown job 'someone-else'"),
            (push(np.zeros(size), updates=[{"piece": 999, "kind": "dense"}]), "array 'd999'"),
            (push(np.zeros(size), shard=data.num_shards), "shard in [0, 4)"),
            (push(np.zeros(size), batch=3), "batch 3 pushed before batch 0"),
            (push(np.zeros(size), epoch=10**9), "too far ahead"),
            (push(np.zeros(size), part=2, parts=2), "expected 0 <= part < parts"),
        ]  # fmt: skip
        for payload, reason in cases:
            header, _ = unpack(await bus.request(subject, payload, timeout=5))
            assert header["outcome"] == "rejected", (reason, header)
            assert reason in str(header["reason"]), header
        # A push of a finished epoch is a duplicate: refused and counted.
        header, _ = unpack(await bus.request(subject, push(np.ones(size), epoch=0), timeout=5))
        assert header["outcome"] == "duplicate"
        params_reply, _ = unpack(
            await bus.request(pserver_subject(harness.job, 0, "params"), pack({"job": "nope"}))
        )
        assert "unknown job 'nope'" in str(params_reply["error"])
        status_subject = pserver_subject(harness.job, 0, "status")
        for request, reason in [
            ({"from_epoch": 10**15, "shards": data.num_shards}, "beyond the open epochs"),
            ({"from_epoch": 0, "shards": 10**12}, "the job has 4"),
        ]:
            reply, _ = unpack(
                await bus.request(status_subject, pack({"job": harness.job, **request}))
            )
            assert reason in str(reply["error"])
        after = await client.pull()
        assert all(np.array_equal(after[name], before[name]) for name in before)
        (status,) = await client.status(from_epoch=1)
        assert status.version == data.num_shards * batches_of(data) and status.duplicates == 1
    finally:
        await harness.stop_all()
        harness.kill_all()


async def test_malformed_tasks_are_terminated_and_the_job_goes_on(
    bus: Bus, nats_server: EmbeddedNats, tmp_path: Path, unique: str
) -> None:
    data = dataset(shards=3, samples=500, holdout=1000)
    harness = JobHarness(
        nats_server.url, f"poison-{unique}", tmp_path, coordinator_args=job_args(data, epochs=1)
    )
    try:
        harness.pserver().start()
        coordinator = harness.coordinator().start()
        await spec_of(bus, harness.job)
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
        client = await client_of(bus, harness.job)
        await assert_exactly_once(client, epochs=1, shards=3, batches=batches_of(data))
        assert await trainer.wait(30) == 0
        log = trainer.stderr_path.read_text()
        assert "unknown job 'other-job'" in log
        assert "task says 99 shards per epoch" in log
    finally:
        await harness.stop_all()
        harness.kill_all()


async def test_sigterm_hands_back_the_rest_of_a_shard_which_resumes_where_it_stopped(
    bus: Bus, nats_server: EmbeddedNats, tmp_path: Path, unique: str
) -> None:
    """Shards of eight batches that take ~2.5x the ack wait: heartbeats keep them from being
    redelivered. SIGTERM mid-shard: the current batch finishes, the trainer exits 0 within
    its grace, and another trainer resumes the shard at its first unapplied batch."""
    data = dataset(shards=4, samples=800, holdout=1000, batch=100)
    harness = JobHarness(
        nats_server.url,
        f"long-{unique}",
        tmp_path,
        coordinator_args=[*job_args(data, epochs=1), "--ack-wait-seconds", "1"],
        trainer_args=["--min-task-seconds", "2.5", "--grace-seconds", "5"],
    )
    try:
        harness.pserver().start()
        harness.trainer("t1").start()
        coordinator = harness.coordinator().start()
        client = await client_of(bus, harness.job)
        t1_log = harness.trainer("t1").stderr_path
        await wait_applied(client, 2)  # t1 is in its first shard of eight batches
        assert await harness.trainer("t1").terminate(timeout=10) == 0
        harness.trainer("t2").start()
        assert await coordinator.wait(120) == 0, coordinator.tail()
        duplicates = await assert_exactly_once(client, epochs=1, shards=4, batches=8)
        assert duplicates == [0]  # no batch pushed twice: heartbeats held, resume was exact
        assert "handing back epoch 0 shard 0 after batch" in t1_log.read_text()
        assert "resumes at batch" in harness.trainer("t2").stderr_path.read_text()
    finally:
        await harness.stop_all()
        harness.kill_all()
