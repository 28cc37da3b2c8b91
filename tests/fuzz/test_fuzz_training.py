"""Hostile input to every subject the training services consume, on a real nats-server.

A coordinator, a pserver and the example trainer run as processes (`tideshift run ...`) on a
job that trains until stopped. The trainers' task queue and the coordinator's membership
subject get the corpus in tests/fuzz/corpus/, two generated monsters and hypothesis-made
mutations of a valid event; each pserver request/reply endpoint (init, params, push, status)
gets the same corpus and mutations of a valid request; the trainers also get a valid task for
an epoch no pserver accepts, which they must terminate. Afterwards every process is alive, the
coordinator and the pserver answer /readyz, each consumer's dead letters equal what the
contract refuses, the pserver counted exactly the requests it answered with a refusal (and
never answered with an unhandled exception), and normal messages sent last are still
processed: the coordinator takes a membership event, the pserver answers a status request,
and training goes on (the trainer takes the next tasks, the pserver applies their pushes).
"""

from __future__ import annotations

import asyncio
import json
import struct
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.fuzz.hostile import (
    corpus,
    metric_in,
    mutations,
    one_seeded_draw,
    refused,
    wire_mutations,
)
from tideshift import events
from tideshift.events.subjects import BoundSubject
from tideshift.services.common.bus import DEAD_LETTER_STREAM, Bus
from tideshift.services.common.embedded_nats import EmbeddedNats
from tideshift.services.common.ports import free_port
from tideshift.services.trainer.core.messages import pack_push_part
from tideshift.services.trainer.core.model import DatasetSpec, dataset_uris
from tideshift.services.trainer.core.wire import WireError, pack, unpack
from tideshift.services.trainer.port.bus import PServerOp, pserver_subject, task_durable

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "integration" / "trainer"))

from trainer_harness import JobHarness, ServiceProcess, applied_total, client_of

pytestmark = pytest.mark.slow

WAIT = 60.0
MUTATIONS = 20  # per subject or pserver operation
DATA = DatasetSpec(
    seed=11, num_shards=2, samples_per_shard=200, holdout_samples=100, batch_size=100
)


def _prefixed(header: bytes) -> bytes:
    return struct.pack(">I", len(header)) + header


# Headers that are well framed but break a JSON parser: nesting past the recursion limit, an
# integer past the digit limit.
WIRE_MONSTERS = (_prefixed(b"[" * 60_000), _prefixed(b'{"header":{"job":' + b"9" * 5_000 + b"}}"))


def refusal(reply: bytes) -> bool:
    """Whether a pserver reply refuses the request; AssertionError when the reply is not a
    wire payload at all (the handler raised instead of answering)."""
    try:
        header, _ = unpack(reply)
    except WireError as error:
        raise AssertionError(
            f"the pserver answered with an unhandled error: {reply[:200]!r}"
        ) from error
    return "error" in header or header.get("outcome") == "rejected"


def get(port: int, path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as answer:
            return answer.status, answer.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()
    except OSError as error:
        return 0, str(error)


async def wait_for(
    check: Callable[[], Awaitable[bool]], what: str, *, alive: list[ServiceProcess]
) -> None:
    deadline = time.monotonic() + WAIT
    while time.monotonic() < deadline:
        for process in alive:
            assert process.running, f"{process.name} exited:\n{process.tail(30)}"
        if await check():
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def requests_of(job: str, data: st.DataObject) -> dict[PServerOp, list[bytes]]:
    """Per pserver operation: the corpus, then mutations of a valid request. Pushes name
    another job, so no mutation can touch the running job's parameters or ledger."""
    push, _ = unpack(
        pack_push_part(
            job=f"{job}-other", push_id="fuzz", epoch=0, shard=0, batch=0, last=False,
            part=0, parts=1, updates=[],
        )
    )  # fmt: skip
    valid: dict[PServerOp, dict[str, Any]] = {
        "init": {"job": job, "pieces": []},
        "params": {"job": job, "pieces": [0]},
        "push": push,
        "status": {"job": job, "from_epoch": 0, "shards": DATA.num_shards},
    }
    hostile = [*corpus().values(), *WIRE_MONSTERS]
    return {
        op: hostile
        + data.draw(st.lists(wire_mutations(header), min_size=MUTATIONS, max_size=MUTATIONS), op)
        for op, header in valid.items()
    }


def events_of(
    job: str, data: st.DataObject
) -> dict[str, tuple[BoundSubject[Any], str, list[bytes]]]:
    """Per event consumer: (subject, dead-letter consumer, the payloads the contract refuses)."""
    now = datetime.now(UTC)
    task = events.ShardTask(job=job, epoch=0, shard=0, shards=DATA.num_shards, issued_at=now)
    member = events.TrainerMembership(job=job, trainer="fuzz", change="left", at=now)
    targets = {
        "trainer": (events.SHARD_TASK.at(job=job), task_durable(job), task),
        "coordinator": (
            events.TRAINER_MEMBERSHIP.at(job=job, trainer="fuzz"),
            f"coordinator-{job}",
            member,
        ),
    }
    chosen = {}
    for name, (subject, consumer, valid) in targets.items():
        encoded = events.encode(valid, source="fuzz")
        generated = data.draw(
            st.lists(mutations(encoded), min_size=MUTATIONS, max_size=MUTATIONS), name
        )
        payloads = [p for p in [*corpus().values(), *generated] if refused(p, type(valid))]
        chosen[name] = (subject, consumer, payloads)
    return chosen


@one_seeded_draw
@given(data=st.data())
def test_training_services_survive_hostile_input_and_account_for_it(
    nats_server: EmbeddedNats, tmp_path_factory: pytest.TempPathFactory, data: st.DataObject
) -> None:
    job = f"fuzz-train-{int(time.time() * 1000) % 10**8}"
    asyncio.run(
        _scenario(
            nats_server.url,
            job,
            tmp_path_factory.mktemp("fuzz-training"),
            requests_of(job, data),
            events_of(job, data),
        )
    )


async def _scenario(
    url: str,
    job: str,
    logs: Path,
    requests: dict[PServerOp, list[bytes]],
    hostile_events: dict[str, tuple[BoundSubject[Any], str, list[bytes]]],
) -> None:
    ports = {"coordinator": free_port("127.0.0.1"), "pserver": free_port("127.0.0.1")}

    def health(name: str) -> list[str]:
        return ["--health-host", "127.0.0.1", "--health-port", str(ports[name])]

    harness = JobHarness(
        url,
        job,
        logs,
        coordinator_args=[
            "--dataset", json.dumps(dataset_uris(DATA)), "--tick-seconds", "0.2",
            *health("coordinator"),
        ],
        pserver_args=health("pserver"),
        # Each task held a little: training goes on at a few tasks a second, not flat out.
        trainer_args=["--min-task-seconds", "0.2"],
    )  # fmt: skip
    bus = await Bus.connect(url, name="fuzz-training")
    try:
        processes = [
            harness.pserver(0).start(),
            harness.coordinator().start(),
            harness.trainer("t1").start(),
        ]
        client = await client_of(bus, job)

        async def training(above: int) -> bool:
            applied = await applied_total(client)
            return applied is not None and applied > above

        await wait_for(lambda: training(0), "training to start", alive=processes)
        pserver_metrics = await asyncio.to_thread(get, ports["pserver"], "/metrics")
        refused_before = {
            op: metric_in(pserver_metrics[1], "tideshift_pserver_requests_refused_total", op=op)
            for op in requests
        }

        # Hostile events: the trainers' work queue (JetStream) and the membership subject.
        for subject, _, payloads in hostile_events.values():
            for payload in payloads:
                if subject.subject.durable:
                    await bus.js.publish(subject.value, payload)
                else:
                    await bus.connection.publish(subject.value, payload)
                    await bus.flush()  # paced: a core subscriber's buffer is not what is tested
        # A task the contract accepts but no pserver ever would (an epoch far beyond the open
        # ones): the trainer terminates it instead of failing on it, again on every redelivery.
        far = events.ShardTask(
            job=job, epoch=10**9, shard=0, shards=DATA.num_shards, issued_at=datetime.now(UTC)
        )
        await bus.publish_durable(events.SHARD_TASK.at(job=job), far)
        # Hostile requests: every pserver endpoint, each answered.
        refusals: dict[PServerOp, int] = {}
        for op, payloads in requests.items():
            subject = pserver_subject(job, 0, op)
            replies = [await bus.request(subject, payload, timeout=10) for payload in payloads]
            assert all(refusal(reply) for reply in replies[: len(corpus()) + len(WIRE_MONSTERS)]), (
                op
            )
            refusals[op] = sum(refusal(reply) for reply in replies)

        for name, (_, consumer, payloads) in hostile_events.items():

            async def lettered(consumer: str = consumer, expected: int = len(payloads)) -> bool:
                letters = await bus.queued(
                    events.DEAD_LETTER.at(consumer=consumer), stream=DEAD_LETTER_STREAM
                )
                assert letters <= expected, f"{consumer}: {letters} dead letters > {expected}"
                return letters == expected

            await wait_for(
                lettered, f"{len(payloads)} dead letters from the {name}", alive=processes
            )

        _, text = await asyncio.to_thread(get, ports["pserver"], "/metrics")
        for op, count in refusals.items():
            counted = metric_in(text, "tideshift_pserver_requests_refused_total", op=op)
            assert counted - refused_before[op] == count, (op, counted, refused_before[op], count)

        # Normal messages sent last are still processed.
        status, _ = unpack(
            await bus.request(
                pserver_subject(job, 0, "status"),
                pack({"job": job, "from_epoch": 0, "shards": DATA.num_shards}),
            )
        )
        assert "error" not in status and status["initialised"] is True, status
        received_before = metric_in(
            (await asyncio.to_thread(get, ports["coordinator"], "/metrics"))[1],
            "tideshift_bus_received_total",
            consumer=f"coordinator-{job}",
        )
        member = events.TrainerMembership(
            job=job, trainer="fuzz", change="left", at=datetime.now(UTC)
        )
        await bus.publish(events.TRAINER_MEMBERSHIP.at(job=job, trainer="fuzz"), member)

        async def membership_taken() -> bool:
            _, text = await asyncio.to_thread(get, ports["coordinator"], "/metrics")
            received = metric_in(
                text, "tideshift_bus_received_total", consumer=f"coordinator-{job}"
            )
            return received > received_before

        await wait_for(
            membership_taken, "the coordinator to take a membership event", alive=processes
        )
        applied = await applied_total(client)
        assert applied is not None
        await wait_for(lambda: training(applied), "training to go on", alive=processes)
        trainer = harness.processes["t1"]

        async def far_task_terminated() -> bool:
            return "terminating a task: epoch 1000000000" in trainer.stderr_path.read_text()

        await wait_for(far_task_terminated, "the far-future task terminated", alive=processes)
        for name, port in ports.items():
            code, body = await asyncio.to_thread(get, port, "/readyz")
            assert code == 200, f"{name}: {body}"
    finally:
        await harness.stop_all(timeout=15)
        harness.kill_all()
        await bus.close()
