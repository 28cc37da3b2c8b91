"""An elastic job as a trainer holds it: `ElasticJob` (joining, the model's layout, pulls,
membership, leaving) and the `Task` it hands out (one shard's batches, pushes, heartbeat and
settling). One class's two halves, kept together: a task works through its job's bus loop,
retry policy and pserver client. See the package docstring for the user's contract."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import socket
import threading
import time
import uuid
from collections.abc import Awaitable, Callable, Coroutine, Iterable, Iterator, Mapping
from typing import Any, Literal, TypeVar

import numpy as np
from prometheus_client import Counter

from tideshift.events import (
    SHARD_TASK,
    TRAINER_JOBS_BUCKET,
    TRAINER_MEMBERS_BUCKET,
    TRAINER_MEMBERSHIP,
    ShardTask,
    TrainerMembership,
)
from tideshift.events.tokens import encode_token
from tideshift.services.common.bus import (
    BUS_UNAVAILABLE,
    TRAINING_TASK_STREAM,
    Bus,
    Delivery,
    RequestFailed,
)
from tideshift.services.common.clock import WALL_CLOCK, utc_now, wait_for_event
from tideshift.services.common.retry import Stopped, exponential, log_retries, retrying_async
from tideshift.services.trainer.core.jobspec import (
    JobSpec,
    MemberBeat,
    PersistedCoordinator,
    StoredLayout,
)
from tideshift.services.trainer.core.layout import (
    Layout,
    NamedArrays,
    check_job_state,
    describe,
    plan,
)
from tideshift.services.trainer.core.pserver_state import MAX_OPEN_EPOCHS
from tideshift.services.trainer.port.bus import (
    MEMBER_TTL_SECONDS,
    job_key,
    member_key,
    task_durable,
)
from tideshift.services.trainer.port.jobs import read_layout_generation, wait_for_spec_saying_so
from tideshift.services.trainer.port.pserver_client import Gradient, PServerClient, PushReply

log = logging.getLogger("tideshift.trainer")
R = TypeVar("R")
B = TypeVar("B")

POLL_SECONDS = 0.2
# A pserver restarting: ask again soon, then less often (it may take a few seconds).
PSERVER_RETRY = exponential(initial=0.05, maximum=1.0)

BATCHES = Counter("tideshift_trainer_batches_total", "Batches pushed by outcome", ["outcome"])
SAMPLES = Counter("tideshift_trainer_samples_total", "Samples whose gradient was applied")
_END: Any = object()


class JobStopped(RuntimeError):
    """The trainer is stopping (SIGTERM) or the job finished before the call could finish."""


class _Loop:
    """An asyncio loop in a daemon thread; `run` waits for a coroutine from sync code."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True, name="bus")
        self.thread.start()

    def run(self, coroutine: Coroutine[Any, Any, R], timeout: float | None = None) -> R:
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result(timeout)

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)


class ElasticJob:
    """A trainer's membership in one elastic job; see the `sdk` package docstring."""

    def __init__(
        self, loop: _Loop, bus: Bus, spec: JobSpec, trainer: str, grace_seconds: float
    ) -> None:
        self._loop = loop
        self.bus = bus
        self.spec = spec
        self.trainer = trainer
        self.grace_seconds = grace_seconds
        self.layout: Layout | None = None
        self.client: PServerClient | None = None
        self._stop_requested = threading.Event()
        self._stop_wakeup = asyncio.Event()  # the same, for waits on the bus loop
        self._stop_at: float | None = None
        self._pull: asyncio.Future[Delivery[ShardTask]] | None = None
        self._deliveries: Any = None
        self._beat: asyncio.Task[None] | None = None
        self._beat_stop = asyncio.Event()
        self._attached = threading.Event()
        self.applied_batches = 0
        self.applied_samples = 0

    # -- setup -------------------------------------------------------------------------------

    @classmethod
    def connect(
        cls,
        job: str | None = None,
        *,
        nats_url: str | None = None,
        trainer: str | None = None,
        grace_seconds: float = 10.0,
        spec_timeout: float = 120.0,
        handle_sigterm: bool = True,
        standby: bool | None = None,
    ) -> ElasticJob:
        """Join `job` (default: $TIDESHIFT_JOB) on `nats_url` (default: $TIDESHIFT_NATS_URL).

        Waits up to `spec_timeout` seconds for the job's coordinator to publish the spec,
        saying so at once and every few seconds (a WARNING, shown without logging set up);
        raises ValueError when the job or URL is not given, TimeoutError when no spec comes,
        and SystemExit(0) on SIGTERM during the wait (the process stops cleanly).

        A warm standby (`standby=True`, default: $TIDESHIFT_STANDBY is "1") connects, reads
        the spec and may `initialize()`, but joins only when `attach()` is called or SIGUSR1
        arrives: its imports and model are ready, so joining takes about a second; until then
        `tasks()` waits and takes no work.
        """
        job = job or os.environ.get("TIDESHIFT_JOB")
        url = nats_url or os.environ.get("TIDESHIFT_NATS_URL")
        if not job:
            raise ValueError("no job: pass job= or set TIDESHIFT_JOB")
        if not url:
            raise ValueError("no NATS server: pass nats_url= or set TIDESHIFT_NATS_URL")
        trainer = (
            trainer
            or os.environ.get("TIDESHIFT_INSTANCE")
            or f"{socket.gethostname()}-{os.getpid()}"
        )
        loop = _Loop()
        # Before the wait: a framework's SIGTERM handler (Paddle's dumps a stack) must never run.
        before_spec = asyncio.Event()
        catch = handle_sigterm and threading.current_thread() is threading.main_thread()
        if catch:
            signal.signal(
                signal.SIGTERM, lambda *_: loop.loop.call_soon_threadsafe(before_spec.set)
            )
        try:
            bus = loop.run(Bus.connect(url, name=f"trainer-{trainer}"))
            spec = loop.run(wait_for_spec_saying_so(bus, job, spec_timeout, before_spec))
        except BaseException:
            loop.stop()
            raise
        if spec is None:
            loop.run(bus.close(), 10)
            loop.stop()
            log.info("job %s: trainer %s stopped before the job spec arrived", job, trainer)
            raise SystemExit(0)
        self = cls(loop, bus, spec, trainer, grace_seconds)
        self._arm(catch=catch, standby=standby)
        return self

    def _arm(self, *, catch: bool, standby: bool | None) -> None:
        """Take over SIGTERM (and SIGUSR1 for a standby) when asked; join unless standing by."""
        if catch:
            signal.signal(signal.SIGTERM, lambda *_: self.request_stop())
        if standby if standby is not None else os.environ.get("TIDESHIFT_STANDBY") == "1":
            if catch:
                signal.signal(signal.SIGUSR1, lambda *_: self.attach())
            log.info(
                "job %s: trainer %s standing by; SIGUSR1 joins it", self.spec.job, self.trainer
            )
        else:
            self.attach()

    def attach(self) -> None:
        """Join the job now (a warm standby's SIGUSR1); a no-op once joined."""
        self._attached.set()

    def _join(self) -> None:
        """Announce this trainer and keep its member key, once, before its first task."""
        if self._beat is None:
            self._beat = self._loop.run(self._start_membership())
            log.info("job %s: trainer %s joined", self.spec.job, self.trainer)

    def request_stop(self) -> None:
        """Finish the current batch, hand the rest back, end `tasks()` (what SIGTERM does)."""
        if not self._stop_requested.is_set():
            self._stop_at = time.monotonic() + self.grace_seconds
            self._stop_requested.set()
            self._loop.loop.call_soon_threadsafe(self._stop_wakeup.set)

    @property
    def stopping(self) -> bool:
        return self._stop_requested.is_set()

    def _past_grace(self) -> bool:
        return self._stop_at is not None and time.monotonic() > self._stop_at

    def initialize(self, state: NamedArrays, *, timeout: float = 120.0) -> None:
        """Make sure the pservers hold the model: the first trainer's `state` wins, later
        callers only check that their arrays match the job's names, shapes and dtypes
        (LayoutError otherwise). Blocks until every pserver is initialised."""
        arrays = {name: np.asarray(value) for name, value in state.items()}
        describe(arrays)  # reject unusable arrays before touching the job
        self._loop.run(self._initialize(arrays), timeout)

    async def _initialize(self, arrays: dict[str, np.ndarray]) -> None:
        lease = await self.bus.lease(
            f"init.{encode_token(self.spec.job)}", holder=self.trainer, ttl_seconds=10.0
        )
        while True:
            found = await read_layout_generation(self.bus, self.spec)
            layout = None if found is None else found[0]
            if found is not None:
                layout, generation = found
                check_job_state(self.spec.job, layout, arrays)
                self.layout = layout
                self.client = PServerClient(self.bus, self.spec, layout)
                with contextlib.suppress(RequestFailed):
                    statuses = await self.client.status()
                    # Pservers still on the model from before a reset are not ready.
                    if all(s.initialised and s.generation == generation for s in statuses):
                        await lease.release()
                        return
            if await lease.try_acquire():
                if layout is None:
                    layout = plan(
                        describe(arrays),
                        self.spec.pservers,
                        max_piece_bytes=self.spec.max_piece_bytes,
                    )
                    jobs = await self.bus.kv(TRAINER_JOBS_BUCKET)
                    stored = StoredLayout(
                        arrays=layout.to_json(),
                        initialised_by=self.trainer,
                        generation=uuid.uuid4().hex,
                    )
                    await jobs.put(job_key(self.spec.job, "layout"), stored)
                    continue  # re-read: the stored layout is the one everybody uses
                with contextlib.suppress(RequestFailed):
                    await PServerClient(self.bus, self.spec, layout).initialise(arrays)
            await WALL_CLOCK.sleep(POLL_SECONDS)

    def _require_client(self) -> PServerClient:
        if self.client is None:
            raise RuntimeError("call initialize(model_state) before pulling or pushing")
        return self.client

    def pull(self) -> dict[str, np.ndarray]:
        """The current parameters (retries while a pserver restarts)."""
        client = self._require_client()
        return self._loop.run(self._retry(client.pull))

    async def _retry(self, attempt: Callable[[], Awaitable[R]]) -> R:
        """`attempt()` until a pserver answers; JobStopped past the grace period or on close."""

        retrying = retrying_async(
            PSERVER_RETRY,
            clock=WALL_CLOCK,
            stopping=self._beat_stop,
            retry_on=RequestFailed,
            before_sleep=log_retries(
                log, f"job {self.spec.job}: a pserver request", level=logging.DEBUG
            ),
            give_up=self._past_grace,
        )

        async def once() -> R:  # tenacity awaits only `async def` functions, not lambdas
            return await attempt()

        try:
            result: R = await retrying(once)
        except RequestFailed as error:
            raise JobStopped(f"gave up after the grace period: {error}") from error
        except Stopped as stopped:
            raise JobStopped("the trainer left the job") from stopped
        return result

    # -- tasks -------------------------------------------------------------------------------

    def tasks(self) -> Iterator[Task]:
        """Shard tasks until the job finishes or this trainer is asked to stop."""
        self._require_client()
        while not self._attached.wait(POLL_SECONDS):
            if self.stopping:
                return
        self._join()
        while not self.stopping:
            delivery = self._loop.run(self._next_delivery())
            if delivery is None:
                return
            task = Task(self, delivery)
            try:
                yield task
            finally:
                self._loop.run(task._settle())

    def _misfit(self, task: ShardTask) -> str | None:
        """Why this task cannot be for this job, or None."""
        if task.job != self.spec.job:
            return f"unknown job {task.job!r}: this trainer serves {self.spec.job!r}"
        if task.shards != self.spec.num_shards:
            return f"task says {task.shards} shards per epoch, the job has {self.spec.num_shards}"
        return None

    async def _finished(self) -> bool:
        try:
            jobs = await self.bus.kv(TRAINER_JOBS_BUCKET)
            stored = await jobs.get(job_key(self.spec.job, "state"), PersistedCoordinator)
        except BUS_UNAVAILABLE as error:
            # A NATS cluster electing the bucket's new leader: not known finished, look again.
            log.warning("job %s: cannot read whether it finished: %s", self.spec.job, error)
            return False
        return stored is not None and bool(stored.state.get("finished"))

    async def _next_delivery(self) -> Delivery[ShardTask] | None:
        if self._deliveries is None:
            self._deliveries = self.bus.consume(
                SHARD_TASK.at(job=self.spec.job),
                stream=TRAINING_TASK_STREAM,
                durable=task_durable(self.spec.job),
                ack_wait_seconds=self.spec.ack_wait_seconds,
                max_ack_pending=1024,
                batch=1,
                fetch_timeout=1.0,
            )
        while not self.stopping:
            if self._pull is None:
                self._pull = asyncio.ensure_future(anext(self._deliveries))
            stop_wait = asyncio.ensure_future(self._stop_wakeup.wait())
            done, _ = await asyncio.wait(
                {self._pull, stop_wait}, timeout=1.0, return_when=asyncio.FIRST_COMPLETED
            )
            stop_wait.cancel()
            if self._pull in done:
                pull, self._pull = self._pull, None
                delivery = pull.result()
                if self.stopping:
                    await delivery.nak()
                    return None
                if (reason := self._misfit(delivery.event.data)) is not None:
                    log.error("job %s: terminating a malformed task: %s", self.spec.job, reason)
                    BATCHES.labels("poison").inc()
                    await delivery.term()
                    continue
                return delivery
            if await self._finished():
                return None
        return None

    # -- membership --------------------------------------------------------------------------

    async def _announce(self, change: Literal["joined", "left"], reason: str) -> None:
        with contextlib.suppress(Exception):  # membership is telemetry; the work goes on
            await self.bus.publish(
                TRAINER_MEMBERSHIP.at(job=self.spec.job, trainer=self.trainer),
                TrainerMembership(
                    job=self.spec.job,
                    trainer=self.trainer,
                    change=change,
                    reason=reason,
                    at=utc_now(WALL_CLOCK),
                ),
            )

    async def _start_membership(self) -> asyncio.Task[None]:
        await self._announce("joined", "")
        return asyncio.create_task(self._keep_member())

    async def _keep_member(self) -> None:
        """Renew this trainer's member key; the coordinator reads a vanished key as a crash."""
        members = await self.bus.kv(TRAINER_MEMBERS_BUCKET, ttl_seconds=MEMBER_TTL_SECONDS)
        key = member_key(self.spec.job, self.trainer)
        while not self._beat_stop.is_set():
            beat = MemberBeat(job=self.spec.job, trainer=self.trainer, at=utc_now(WALL_CLOCK))
            try:
                await members.put(key, beat)
            except Exception as error:
                log.warning("job %s: member heartbeat failed: %s", self.spec.job, error)
            await wait_for_event(WALL_CLOCK, self._beat_stop, MEMBER_TTL_SECONDS / 3)

    def close(self) -> None:
        """Leave the job: announce it, drop the member key, close the bus."""
        self._loop.run(self._close(), 30)
        self._loop.stop()

    async def _close(self) -> None:
        if self._pull is not None:
            self._pull.cancel()
            with contextlib.suppress(BaseException):
                late = await self._pull
                await late.nak()  # the pull won the race with the cancel: hand it straight back
        if self._deliveries is not None:
            with contextlib.suppress(Exception):
                await self._deliveries.aclose()
        if self._beat is not None:  # a standby that never joined has nothing to announce
            await self._announce("left", "stopped" if self.stopping else "done")
        self._beat_stop.set()
        if self._beat is not None:
            await self._beat
        with contextlib.suppress(Exception):
            members = await self.bus.kv(TRAINER_MEMBERS_BUCKET, ttl_seconds=MEMBER_TTL_SECONDS)
            await members.delete(member_key(self.spec.job, self.trainer))
        await self.bus.close()

    def __enter__(self) -> ElasticJob:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def push_outcome(outcomes: set[str]) -> str:
    """A batch none of whose pservers rejected it: "applied" only if no pserver already held
    it. After a rollback the re-push is applied on the pserver that lost the batch and refused
    on the others; the batch was counted when first applied, so it is a duplicate now."""
    return "duplicate" if "duplicate" in outcomes else "applied"


class Task:
    """One shard of one epoch, held by this trainer until settled (acked or handed back).

    The job's other half: it runs on its job's bus loop, pulls and pushes through its job's
    pserver client and retry policy, and adds to its job's applied counts."""

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
