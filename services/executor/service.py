"""`tideshift run executor`: scale commands from a durable consumer -> Kubernetes -> results.

Several executors may share the durable consumer: each command goes to one of them, and the
per-target records (see `tideshift.services.executor.executor`) keep two of them from acting on one
target at once. A result is published (JetStream) before the command is acked, so a crash
in between redelivers the command, which then finds its work done and reports a no-op.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Sequence
from typing import Any

from prometheus_client import Counter, Histogram
from pydantic import Field

from tideshift.events import SCALE_COMMAND, SCALE_RESULT, BoundSubject, ScaleCommand, ScaleResult
from tideshift.services.cluster.connect import open_kubernetes
from tideshift.services.cluster.port import ClusterError, ClusterPort
from tideshift.services.common.bus import SCALE_STREAM, Bus, Delivery
from tideshift.services.common.retry import exponential
from tideshift.services.common.runtime import ServiceContext, run_service
from tideshift.services.common.settings import ServiceSettings, parse_settings
from tideshift.services.executor.executor import RECORD_BUCKET, Executor, RecordStore

log = logging.getLogger("tideshift.executor")

# A failed command goes back to JetStream with this delay before its next delivery.
COMMAND_RETRY = exponential(initial=2.0, maximum=30.0)

RESULTS = Counter("tideshift_executor_results_total", "Scale results published", ["outcome"])
RETRIES = Counter("tideshift_executor_retries_total", "Commands handed back for a retry")
LATENCY = Histogram(
    "tideshift_executor_seconds",
    "From receiving a command to publishing its result",
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
)


class ExecutorSettings(ServiceSettings):
    """Apply scale commands to Kubernetes and publish what was done."""

    kubeconfig: str | None = Field(
        default=None,
        description="kubeconfig path; unset = $KUBECONFIG or ~/.kube/config, or in-cluster",
    )
    kube_context: str | None = Field(default=None, description="kubeconfig context to use")
    durable: str = Field(
        default="tideshift-executor",
        pattern=r"^[A-Za-z0-9_-]+$",
        description="durable consumer name shared by all executors",
    )
    dry_run: bool = Field(default=False, description="only publish what would be done")
    max_step: int = Field(
        default=0, ge=0, description="largest replica change per command; 0 = unlimited"
    )
    max_attempts: int = Field(
        default=5, ge=1, description="deliveries of a command before it is reported failed"
    )
    ack_wait_seconds: float = Field(
        default=30.0, gt=0, description="redeliver a command not acked within this time"
    )
    record_bucket: str = Field(
        default=RECORD_BUCKET,
        pattern=r"^[A-Za-z0-9_-]+$",
        description="NATS KV bucket of per-target applied commands (idempotency)",
    )


def _is_transient(error: BaseException) -> bool:
    """Worth another delivery: anything but a definite answer from the cluster."""
    if isinstance(error, ClusterError):
        return error.transient
    # Network trouble with NATS, lost claim races: retry up to max_attempts.
    return True


async def process(
    executor: Executor,
    bus: Bus,
    delivery: Delivery[ScaleCommand],
    *,
    max_attempts: int,
) -> ScaleResult | None:
    """Handle one delivery to the end: result published and acked, or handed back (nak)."""
    command = delivery.event.data
    started = asyncio.get_running_loop().time()
    try:
        result = await executor.handle(command)
    except Exception as error:  # the loop never dies on one command
        if _is_transient(error) and delivery.num_delivered < max_attempts:
            RETRIES.inc()
            delay = COMMAND_RETRY.delay(delivery.num_delivered)
            log.warning(
                "%s for %s failed (%s); retry %d in %.0fs",
                command.idempotency_key,
                command.target,
                error,
                delivery.num_delivered,
                delay,
            )
            await delivery.nak(delay_seconds=delay)
            return None
        log.error("%s for %s failed: %s", command.idempotency_key, command.target, error)
        result = executor.result_for(command, "failed", message=f"{type(error).__name__}: {error}")
    subject = SCALE_RESULT.at(
        namespace=command.target.namespace, kind=command.target.kind, name=command.target.name
    )
    await bus.publish_durable(subject, result, msg_id=f"result-{command.idempotency_key}")
    await delivery.ack()
    RESULTS.labels(result.outcome).inc()
    LATENCY.observe(asyncio.get_running_loop().time() - started)
    log.info(
        "%s %s -> %s (%s -> %s) %s",
        command.target,
        command.desired,
        result.outcome,
        result.previous,
        result.current,
        result.message,
    )
    return result


async def consume(
    executor: Executor,
    bus: Bus,
    *,
    durable: str,
    max_attempts: int = 5,
    ack_wait_seconds: float = 30.0,
    stopping: asyncio.Event | None = None,
    ready: asyncio.Event | None = None,
    subject: BoundSubject[ScaleCommand] | None = None,
) -> None:
    """Process commands until `stopping` is set (a command in hand is finished first).

    `subject` narrows the commands taken (default: all), e.g. to one namespace.
    """
    stopping = stopping or asyncio.Event()
    deliveries = bus.consume(
        subject or SCALE_COMMAND.filter(),
        stream=SCALE_STREAM,
        durable=durable,
        ack_wait_seconds=ack_wait_seconds,
        fetch_timeout=0.5,
    )
    iterator: Any = deliveries.__aiter__()
    next_delivery: asyncio.Future[Delivery[ScaleCommand]] | None = None
    if ready is not None:
        ready.set()
    try:
        while not stopping.is_set():
            next_delivery = asyncio.ensure_future(iterator.__anext__())
            stop_wait = asyncio.ensure_future(stopping.wait())
            try:
                done, _ = await asyncio.wait(
                    {next_delivery, stop_wait}, return_when=asyncio.FIRST_COMPLETED
                )
            finally:
                stop_wait.cancel()
            if next_delivery not in done:
                break
            delivery = next_delivery.result()
            next_delivery = None
            try:
                await process(executor, bus, delivery, max_attempts=max_attempts)
            except Exception as error:
                # Result not published or ack lost: the command comes back after ack_wait.
                log.warning("could not finish %s: %s", delivery.event.data.idempotency_key, error)
    finally:
        if next_delivery is not None and not next_delivery.done():
            next_delivery.cancel()
            with contextlib.suppress(asyncio.CancelledError, StopAsyncIteration):
                await next_delivery
        with contextlib.suppress(Exception):
            await iterator.aclose()


async def build_executor(
    bus: Bus, port: ClusterPort, *, name: str, bucket: str, dry_run: bool, max_step: int
) -> Executor:
    records = RecordStore(await bus.kv(bucket))
    return Executor(port, records, name=name, dry_run=dry_run, max_step=max_step)


async def serve(context: ServiceContext) -> None:
    settings = context.settings
    assert isinstance(settings, ExecutorSettings)
    port = await open_kubernetes(settings.kubeconfig, context=settings.kube_context)
    try:
        executor = await build_executor(
            context.bus,
            port,
            name=f"executor-{context.instance}",
            bucket=settings.record_bucket,
            dry_run=settings.dry_run,
            max_step=settings.max_step,
        )
        await consume(
            executor,
            context.bus,
            durable=settings.durable,
            max_attempts=settings.max_attempts,
            ack_wait_seconds=settings.ack_wait_seconds,
            stopping=context.stopping,
            ready=context.ready,
        )
    finally:
        await port.close()


def main(argv: Sequence[str]) -> int:
    settings = parse_settings(ExecutorSettings, argv, prog="tideshift run executor")
    return run_service("executor", settings, serve)
