"""`tideshift run executor`: scale commands from a durable consumer -> Kubernetes -> results.

Several executors may share the durable consumer: each command goes to one of them, and the
per-target records (see `tideshift.services.executor.executor`) keep two of them from acting on one
target at once. A result is published (JetStream) before the command is acked, so a crash
in between redelivers the command, which then finds its work done and reports a no-op.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections.abc import AsyncIterator
from typing import Protocol

from prometheus_client import Counter, Gauge, Histogram

from tideshift.events import SCALE_COMMAND, SCALE_RESULT, BoundSubject, ScaleCommand, ScaleResult
from tideshift.services.cluster.adapters.http import KubeHttp
from tideshift.services.cluster.connect import open_kubernetes
from tideshift.services.cluster.port import ClusterError
from tideshift.services.common.bus import SCALE_STREAM, Delivery, follow
from tideshift.services.common.bus.port import BusPort
from tideshift.services.common.bus.streams import StreamSpec
from tideshift.services.common.clock import WALL_CLOCK, Clock
from tideshift.services.common.retry import exponential
from tideshift.services.common.runtime import ServiceContext, service_main
from tideshift.services.executor.batch_capacity import (
    BatchAdvertiser,
    NodeResourceWriter,
    PrometheusNodeUsage,
)
from tideshift.services.executor.compaction import (
    ClusterListing,
    DeletionCostWriter,
    mark_scale_down_victims,
)
from tideshift.services.executor.executor import (
    FAILED_REASON,
    EventRecorder,
    Executor,
    KVFightStore,
    OtherAutoscalers,
    RecordStore,
    ScaleWriter,
)
from tideshift.services.executor.kueue_lending import KueueLender, QuotaLender, lend_from_plans
from tideshift.services.executor.settings import ExecutorSettings

log = logging.getLogger("tideshift.executor")

# A failed command goes back to JetStream with this delay before its next delivery.
COMMAND_RETRY = exponential(initial=2.0, maximum=30.0)

RESULTS = Counter("tideshift_executor_results_total", "Scale results published", ["outcome"])
RETRIES = Counter("tideshift_executor_retries_total", "Commands handed back for a retry")
OBSERVING = Gauge(
    "tideshift_executor_observe_mode", "1 while this executor is in observe mode (scales nothing)"
)
LATENCY = Histogram(
    "tideshift_executor_seconds",
    "From receiving a command to publishing its result",
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
)


class PackingWriter(DeletionCostWriter, NodeResourceWriter, Protocol):
    """The scheduler hints a real cluster takes: deletion costs, Node extended resources."""


class ExecutorCluster(ScaleWriter, ClusterListing, EventRecorder, Protocol):
    """What the executor needs of a cluster: scales to write, nodes and pods to pack, events
    to tell a target's owner, and its connections to release when it stops."""

    async def close(self) -> None: ...


def _is_transient(error: BaseException) -> bool:
    """Worth another delivery: anything but a definite answer from the cluster."""
    if isinstance(error, ClusterError):
        return error.transient
    # Network trouble with NATS, lost claim races: retry up to max_attempts.
    return True


async def process(
    executor: Executor,
    bus: BusPort,
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
        await executor.warn(command.target, FAILED_REASON, f"{command.idempotency_key}: {error}")
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
    bus: BusPort,
    *,
    durable: str,
    max_attempts: int = 5,
    ack_wait_seconds: float = 30.0,
    stopping: asyncio.Event | None = None,
    ready: asyncio.Event | None = None,
    subject: BoundSubject[ScaleCommand] | None = None,
    clock: Clock = WALL_CLOCK,
) -> None:
    """Process commands until `stopping` is set (a command in hand is finished first); a lost
    consumer is followed again with the bus's backoff.

    `subject` narrows the commands taken (default: all), e.g. to one namespace.
    """
    stopping = stopping or asyncio.Event()

    def deliveries() -> AsyncIterator[Delivery[ScaleCommand]]:
        return bus.consume(
            subject or SCALE_COMMAND.filter(),
            stream=SCALE_STREAM,
            durable=durable,
            ack_wait_seconds=ack_wait_seconds,
            fetch_timeout=0.5,
        )

    async def finish(delivery: Delivery[ScaleCommand]) -> None:
        try:
            await process(executor, bus, delivery, max_attempts=max_attempts)
        except Exception as error:
            # Result not published or ack lost: the command comes back after ack_wait.
            log.warning("could not finish %s: %s", delivery.event.data.idempotency_key, error)

    if ready is not None:
        ready.set()
    await follow(deliveries, finish, clock=clock, stopping=stopping, name="scale commands")


async def build_executor(
    bus: BusPort,
    port: ExecutorCluster,
    settings: ExecutorSettings,
    *,
    name: str,
    clock: Clock = WALL_CLOCK,
    writer: PackingWriter | None = None,
) -> Executor:
    """The executor as the settings describe it, complete: its records, admission, mode,
    clock, Events, and (on a cluster that takes `writer`'s hints) compaction."""
    before_scale_down = (
        functools.partial(mark_scale_down_victims, port, writer)
        if settings.compaction and writer is not None
        else None
    )
    records = await bus.kv(settings.record_bucket)
    return Executor(
        port,
        RecordStore(records),
        name=name,
        max_step=settings.max_step,
        dry_run=settings.dry_run,
        observe=settings.mode == "observe",
        clock=clock,
        admission=settings.admission(),
        events=port,
        before_scale_down=before_scale_down,
        fights=KVFightStore(records) if settings.fight_detection else None,
        fight_policy=settings.fight_policy(),
    )


def build_advertiser(
    port: ExecutorCluster, writer: PackingWriter | None, settings: ExecutorSettings
) -> BatchAdvertiser | None:
    """The batch-resource advertiser when it is on (never in observe mode or a dry run,
    which write nothing to Nodes either, nor on a cluster without `writer`)."""
    if writer is None or settings.dry_run or settings.mode == "observe":
        return None
    if not settings.batch_resources or settings.prometheus_url is None:
        return None
    usage = PrometheusNodeUsage(
        settings.prometheus_url,
        cpu_query=settings.batch_cpu_query,
        memory_query=settings.batch_memory_query,
        timeout_s=10.0,
    )
    return BatchAdvertiser(port, writer, usage, settings.lending())


def build_lender(port: ExecutorCluster, settings: ExecutorSettings) -> QuotaLender | None:
    """The quota lender when `kueue_lending` is on (never in observe mode or a dry run, nor
    on a cluster that is not Kubernetes)."""
    if not settings.kueue_lending:
        return None
    http = getattr(port, "http", None)
    if settings.dry_run or settings.mode == "observe" or not isinstance(http, KubeHttp):
        log.warning("kueue_lending is on but lends nothing (observe, dry run or no Kubernetes)")
        return None
    return KueueLender(http, config=settings.kueue_quota())


async def _connect(
    settings: ExecutorSettings, cluster: ExecutorCluster | None
) -> tuple[ExecutorCluster, PackingWriter | None, OtherAutoscalers | None]:
    """The port, its packing writes on Kubernetes (a simulated cluster packs by itself), and
    its HPAs and ScaledObjects (a simulated cluster has none)."""
    if cluster is not None:
        return cluster, None, None
    # Every scale-down lists the cluster's nodes and pods (compaction), and so does the batch
    # advertiser each period: the port follows them with informers and answers from their
    # caches instead of listing the whole cluster each time.
    port = await open_kubernetes(settings.kubeconfig, context=settings.kube_context, follow=True)
    autoscalers = port.autoscalers() if settings.other_autoscalers else None
    return port, port.packing_writer(), autoscalers


async def _keep_history(bus: BusPort, stream: StreamSpec) -> None:
    """Create or update the decision history with this executor's limits; without it the
    executor still works, and `tideshift explain` has less to show."""
    try:
        await bus.ensure_streams((stream,))
    except Exception as error:
        log.error("no decision history (stream %s): %s", stream.name, error)


async def serve(
    settings: ExecutorSettings,
    context: ServiceContext,
    *,
    clock: Clock = WALL_CLOCK,
    cluster: ExecutorCluster | None = None,
    lender: QuotaLender | None = None,
) -> None:
    """The service body; `cluster` replaces the Kubernetes port the settings name (the demo
    passes its simulated cluster and clock; nothing else differs), `lender` the quota lent
    to Kueue (tests)."""
    port, writer, autoscalers = await _connect(settings, cluster)
    advertising: asyncio.Task[None] | None = None
    lending: asyncio.Task[None] | None = None
    try:
        executor = await build_executor(
            context.bus,
            port,
            settings,
            name=f"executor-{context.instance}",
            clock=clock,
            writer=writer,
        )
        executor.autoscalers = autoscalers
        OBSERVING.set(1 if executor.observe else 0)
        await _keep_history(context.bus, settings.history_stream())
        advertiser = build_advertiser(port, writer, settings)
        if advertiser is not None:
            advertising = asyncio.create_task(
                advertiser.run(settings.batch_interval_seconds, context.stopping, clock=clock)
            )
        lender = lender or build_lender(port, settings)
        if lender is not None:
            lending = asyncio.create_task(
                lend_from_plans(
                    lender,
                    context.bus,
                    executor=executor.name,
                    clock=clock,
                    stopping=context.stopping,
                )
            )
        await consume(
            executor,
            context.bus,
            durable=settings.durable,
            max_attempts=settings.max_attempts,
            ack_wait_seconds=settings.ack_wait_seconds,
            stopping=context.stopping,
            ready=context.ready,
            clock=clock,
        )
    finally:
        for task in (advertising, lending):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        await port.close()


main = service_main("executor", ExecutorSettings, serve)

__all__ = [
    "ExecutorSettings",
    "build_advertiser",
    "build_executor",
    "consume",
    "main",
    "process",
    "serve",
]
