"""One shard task in a trainer's hands: its batches from the first unapplied one, the
pushes, the ack-timer heartbeat and how the task is settled (acked, handed back or
terminated). Part of the SDK: `sdk.py` runs it on its bus loop. Imports no other service."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np
from prometheus_client import Counter

from tideshift.events import ShardTask
from tideshift.events.tokens import encode_token
from tideshift.services.common.bus import Delivery
from tideshift.services.common.clock import WALL_CLOCK
from tideshift.services.trainer.core.pserver_state import MAX_OPEN_EPOCHS
from tideshift.services.trainer.pserver_client import Gradient, PushReply

if TYPE_CHECKING:
    from tideshift.services.trainer.sdk import ElasticJob

log = logging.getLogger("tideshift.trainer")
B = TypeVar("B")

BATCHES = Counter("tideshift_trainer_batches_total", "Batches pushed by outcome", ["outcome"])
SAMPLES = Counter("tideshift_trainer_samples_total", "Samples whose gradient was applied")
_END: Any = object()


def push_outcome(outcomes: set[str]) -> str:
    """A batch none of whose pservers rejected it: "applied" only if no pserver already held
    it. After a rollback the re-push is applied on the pserver that lost the batch and refused
    on the others; the batch was counted when first applied, so it is a duplicate now."""
    return "duplicate" if "duplicate" in outcomes else "applied"


class Task:
    """One shard of one epoch, held by this trainer until settled (acked or handed back)."""

    def __init__(self, job: ElasticJob, delivery: Delivery[ShardTask]) -> None:
        self.job = job
        self.delivery = delivery
        self.epoch = delivery.event.data.epoch
        self.shard = delivery.event.data.shard
        self.location = job.spec.shards[self.shard]
        self.batch: int | None = None  # index of the batch being trained
        self.last = False
        self.pushed = True
        self.complete = False
        # A pserver is behind this shard's position (it restored an older checkpoint): the
        # shard goes back to the queue and resumes at the first batch every pserver lacks.
        self.resume = False
        # Why no pserver would ever take this task (an epoch beyond the open ones): it is
        # terminated, never handed back for every trainer to fail on in turn.
        self.refused: str | None = None
        self._heartbeat = job._loop.run(self._start_heartbeat())
        log.info(
            "job %s: training epoch %d shard %d (delivery %d)",
            job.spec.job,
            self.epoch,
            self.shard,
            delivery.num_delivered,
        )

    async def _start_heartbeat(self) -> asyncio.Task[None]:
        return asyncio.create_task(self._keep_alive())

    async def _keep_alive(self) -> None:
        every = max(0.2, self.job.spec.ack_wait_seconds / 3)
        while True:  # until _settle cancels it
            await WALL_CLOCK.sleep(every)
            with contextlib.suppress(Exception):  # a missed heartbeat only risks a redelivery
                await self.delivery.in_progress()

    def pull(self) -> dict[str, np.ndarray]:
        """The current parameters, as named arrays."""
        return self.job.pull()

    def _start(self) -> int:
        """The first batch not yet applied on every pserver, or -1 if the shard is done."""
        client = self.job._require_client()
        statuses = self.job._loop.run(
            self.job._retry(lambda: client.status(position=(self.epoch, self.shard)))
        )
        beyond = [s.index for s in statuses if self.epoch >= s.watermark + MAX_OPEN_EPOCHS]
        if beyond:
            self.refused = (
                f"epoch {self.epoch} is beyond the epochs pservers {beyond} accept "
                f"(watermark + {MAX_OPEN_EPOCHS})"
            )
            return -1
        open_positions = [status.next_batch for status in statuses if not status.finished]
        return min(open_positions) if open_positions else -1

    def batches(self, read_shard: Callable[[str], Iterable[B]]) -> Iterator[B]:
        """The shard's batches from its first unapplied one; push each before the next.

        `read_shard(location)` is the user's reader for one shard location of the job spec.
        Stops early (handing the rest back) when the trainer is asked to stop.
        """
        start = self._start()
        if start > 0:
            log.info("job %s: shard %d resumes at batch %d", self.job.spec.job, self.shard, start)
        if start < 0:
            self.complete = self.refused is None
            return
        iterator = iter(read_shard(self.location))
        for _ in range(start):
            if next(iterator, _END) is _END:
                raise ValueError(
                    f"{self.location}: has fewer than {start} batches, yet they were applied; "
                    "did the shard change?"
                )
        current = next(iterator, _END)
        if current is _END:  # an empty shard: finish it with an empty batch
            self.batch, self.last, self.pushed = start, True, False
            self.push({}, samples=0)
            return
        index = start
        while current is not _END and not self.job.stopping and not self.resume:
            following = next(iterator, _END)
            self.batch, self.last, self.pushed = index, following is _END, False
            yield current
            if not self.pushed:
                raise RuntimeError(f"batch {index} of shard {self.shard} was not pushed")
            current, index = following, index + 1

    def push(self, gradients: Mapping[str, Gradient], *, samples: int) -> str:
        """Send this batch's gradients (dense arrays or `(indices, rows)`) once.

        Returns "applied" (every pserver applied it), "duplicate" (a pserver already held
        it: another trainer, or a push before a pserver rolled back, applied it first; count
        only "applied" to check exactly-once) or "rejected" (a pserver restarted behind this
        shard: the shard is handed back and `batches()` ends). Raises ValueError when the
        gradients do not fit the model.
        """
        if self.batch is None or self.pushed:
            raise RuntimeError("push() once per batch, inside task.batches()")
        client = self.job._require_client()
        batch, last = self.batch, self.last
        push_id = f"{encode_token(self.job.trainer)}/{uuid.uuid4().hex[:12]}"
        answered: dict[int, PushReply] = {}
        replies: list[PushReply] = self.job._loop.run(
            self.job._retry(
                lambda: client.push(
                    gradients,
                    push_id=push_id,
                    epoch=self.epoch,
                    shard=self.shard,
                    batch=batch,
                    last=last,
                    answered=answered,
                )
            )
        )
        self.pushed = True
        outcomes = {reply.outcome for reply in replies}
        if "rejected" in outcomes:
            behind = [r for r in replies if r.outcome == "rejected" and r.next_batch < batch]
            reasons = "; ".join(f"pserver {r.index}: {r.reason}" for r in replies if r.reason)
            BATCHES.labels("rejected").inc()
            if behind:
                log.warning("job %s: resuming shard %d: %s", self.job.spec.job, self.shard, reasons)
                self.resume = True
                return "rejected"
            raise ValueError(f"batch {batch} of shard {self.shard} rejected: {reasons}")
        outcome = push_outcome(outcomes)
        BATCHES.labels(outcome).inc()
        if outcome == "applied":
            if not self.job.applied_batches:
                log.info(
                    "job %s: trainer %s applied its first batch",
                    self.job.spec.job,
                    self.job.trainer,
                )
            SAMPLES.inc(samples)
            self.job.applied_batches += 1
            self.job.applied_samples += samples
        if last:
            self.complete = True
        return outcome

    async def _settle(self) -> None:
        self._heartbeat.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._heartbeat
        try:
            if self.refused is not None:
                log.error("job %s: terminating a task: %s", self.job.spec.job, self.refused)
                BATCHES.labels("poison").inc()
                await self.delivery.term()
            elif self.complete:
                await self.delivery.ack()
            else:
                log.info(
                    "job %s: handing back epoch %d shard %d after batch %s",
                    self.job.spec.job,
                    self.epoch,
                    self.shard,
                    "none" if self.batch is None else self.batch,
                )
                await self.delivery.nak()  # another trainer resumes at the first unapplied batch
        except Exception as error:  # the queue redelivers after the ack wait instead
            log.warning(
                "job %s: could not settle shard %d: %s", self.job.spec.job, self.shard, error
            )
