"""`tideshift run executor`: scale commands from a durable consumer -> Kubernetes -> results.

Several executors may share the durable consumer: each command goes to one of them, and the
per-target records (see `tideshift.services.executor.executor`) keep two of them from acting on one
target at once. A result is published (JetStream) before the command is acked, so a crash
in between redelivers the command, which then finds its work done and reports a no-op.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import logging
from collections.abc import AsyncIterator, Sequence
from typing import Literal, Protocol

from prometheus_client import Counter, Gauge, Histogram
from pydantic import Field, field_validator, model_validator

from tideshift.events import (
    EXECUTOR_RECORDS_BUCKET,
    SCALE_COMMAND,
    SCALE_RESULT,
    BoundSubject,
    ScaleCommand,
    ScaleResult,
    WorkloadRef,
)
from tideshift.services.cluster.connect import open_kubernetes
from tideshift.services.cluster.core.overcommit import OvercommitConfig
from tideshift.services.cluster.port import ClusterError
from tideshift.services.common.bus import SCALE_STREAM, Bus, Delivery, follow
from tideshift.services.common.bus.streams import HISTORY_STREAM, StreamSpec
from tideshift.services.common.clock import WALL_CLOCK, Clock
from tideshift.services.common.retry import exponential
from tideshift.services.common.runtime import ServiceContext, run_service
from tideshift.services.common.settings import ServiceSettings, parse_settings
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
from tideshift.services.executor.core.decision import Admission
from tideshift.services.executor.executor import (
    FAILED_REASON,
    EventRecorder,
    Executor,
    RecordStore,
    ScaleWriter,
)

log = logging.getLogger("tideshift.executor")

# Non-batch usage per node (cAdvisor series relabelled with `node`); trainers that borrow
# batch resources run in the training namespace and are left out.
NON_BATCH_CPU_QUERY = (
    'sum by (node) (rate(container_cpu_usage_seconds_total{container!="",'
    'namespace!="tideshift-training"}[2m]))'
)
NON_BATCH_MEMORY_QUERY = (
    'sum by (node) (container_memory_working_set_bytes{container!="",'
    'namespace!="tideshift-training"})'
)

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
    mode: Literal["act", "observe"] = Field(
        default="act",
        description="observe: change no object; every command that would scale a target "
        "leaves a TideshiftWouldScale Event on it and a would_scale result",
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
        default=EXECUTOR_RECORDS_BUCKET,
        pattern=r"^[A-Za-z0-9_-]+$",
        description="NATS KV bucket of per-target applied commands (idempotency)",
    )
    compaction: bool = Field(
        default=True,
        description="before lowering a Deployment, mark the pods whose removal frees whole "
        "nodes with pod-deletion-cost so they go first",
    )
    managed_only: bool = Field(
        default=True,
        description="act only on targets labelled tideshift.io/role (serving or training) "
        "or listed in managed_targets; reject commands for anything else",
    )
    managed_targets: list[str] = Field(
        default_factory=list,
        description="targets managed without the label, as Kind.group/namespace/name "
        "(e.g. Deployment.apps/shop/web)",
    )
    allowed_namespaces: list[str] = Field(
        default_factory=list,
        description="namespaces whose targets may be scaled; empty = every namespace",
    )
    batch_resources: bool = Field(
        default=False,
        description="advertise tideshift.io/batch-cpu and batch-memory on each Node's status: "
        "what non-batch pods request but do not use (usage from Prometheus), within "
        "allocatable - that usage - batch_margin",
    )
    prometheus_url: str | None = Field(
        default=None, description="Prometheus with per-node usage (needed by batch_resources)"
    )
    batch_margin: float = Field(
        default=0.1, ge=0.0, lt=1.0, description="fraction of each node's allocatable never lent"
    )
    batch_interval_seconds: float = Field(
        default=30.0, gt=0, description="how often batch resources are re-advertised"
    )
    batch_cpu_query: str = Field(
        default=NON_BATCH_CPU_QUERY,
        description="PromQL: cpu cores used by non-batch pods, one series per `node` label",
    )
    batch_memory_query: str = Field(
        default=NON_BATCH_MEMORY_QUERY,
        description="PromQL: memory bytes used by non-batch pods, one series per `node` label",
    )
    history_max_age_hours: float = Field(
        default=HISTORY_STREAM.max_age_seconds / 3600,
        gt=0,
        le=24 * 366,
        description="how long plans, scale commands and results are kept for `tideshift "
        "explain` (the TIDESHIFT_HISTORY stream, which this service creates)",
    )
    history_max_bytes: int = Field(
        default=HISTORY_STREAM.max_bytes,
        ge=1024 * 1024,
        description="the decision history's size limit; the oldest go first",
    )
    history_max_messages: int = Field(
        default=HISTORY_STREAM.max_msgs, ge=1000, description="its message limit, likewise"
    )

    @field_validator("managed_targets")
    @classmethod
    def _target_refs(cls, values: list[str]) -> list[str]:
        for value in values:
            try:
                WorkloadRef.parse(value)
            except ValueError as error:
                raise ValueError(f"{value!r}: {error}") from None
        return values

    def history_stream(self) -> StreamSpec:
        return dataclasses.replace(
            HISTORY_STREAM,
            max_age_seconds=self.history_max_age_hours * 3600,
            max_bytes=self.history_max_bytes,
            max_msgs=self.history_max_messages,
        )

    def admission(self) -> Admission:
        return Admission(
            managed_only=self.managed_only,
            listed=frozenset(WorkloadRef.parse(value) for value in self.managed_targets),
            namespaces=frozenset(self.allowed_namespaces),
        )

    @model_validator(mode="after")
    def _prometheus_for_batch(self) -> ExecutorSettings:
        if self.batch_resources and not self.prometheus_url:
            raise ValueError("prometheus_url: required when batch_resources is on")
        return self


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
    bus: Bus,
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
    bus: Bus, port: ScaleWriter, *, name: str, bucket: str, dry_run: bool, max_step: int
) -> Executor:
    records = RecordStore(await bus.kv(bucket))
    return Executor(port, records, name=name, dry_run=dry_run, max_step=max_step)


def _packing(
    executor: Executor, port: ExecutorCluster, writer: PackingWriter, settings: ExecutorSettings
) -> BatchAdvertiser | None:
    """Wires compaction into the executor; the batch-resource advertiser when it is on."""
    if settings.compaction:
        executor.before_scale_down = functools.partial(mark_scale_down_victims, port, writer)
    # Observe mode writes nothing to Nodes either.
    if settings.dry_run or settings.mode == "observe" or not settings.batch_resources:
        return None
    if settings.prometheus_url is None:
        return None
    usage = PrometheusNodeUsage(
        settings.prometheus_url,
        cpu_query=settings.batch_cpu_query,
        memory_query=settings.batch_memory_query,
        timeout_s=10.0,
    )
    return BatchAdvertiser(port, writer, usage, OvercommitConfig(margin=settings.batch_margin))


async def _connect(
    settings: ExecutorSettings, cluster: ExecutorCluster | None
) -> tuple[ExecutorCluster, PackingWriter | None]:
    """The port, and its packing writes on Kubernetes (a simulated cluster packs by itself)."""
    if cluster is not None:
        return cluster, None
    # Every scale-down lists the cluster's nodes and pods (compaction), and so does the batch
    # advertiser each period: the port follows them with informers and answers from their
    # caches instead of listing the whole cluster each time.
    port = await open_kubernetes(settings.kubeconfig, context=settings.kube_context, follow=True)
    return port, port.packing_writer()


async def _keep_history(bus: Bus, stream: StreamSpec) -> None:
    """Create or update the decision history with this executor's limits; without it the
    executor still works, and `tideshift explain` has less to show."""
    try:
        await bus.ensure_streams((stream,))
    except Exception as error:
        log.error("no decision history (stream %s): %s", stream.name, error)


async def serve(
    context: ServiceContext, *, cluster: ExecutorCluster | None = None, clock: Clock = WALL_CLOCK
) -> None:
    """The service body; `cluster` replaces the Kubernetes port the settings name (the demo
    passes its simulated cluster and clock; nothing else differs)."""
    settings = context.settings
    assert isinstance(settings, ExecutorSettings)
    port, writer = await _connect(settings, cluster)
    advertising: asyncio.Task[None] | None = None
    try:
        executor = await build_executor(
            context.bus,
            port,
            name=f"executor-{context.instance}",
            bucket=settings.record_bucket,
            dry_run=settings.dry_run,
            max_step=settings.max_step,
        )
        executor.clock = clock
        executor.admission = settings.admission()
        executor.events = port
        executor.observe = settings.mode == "observe"
        OBSERVING.set(1 if executor.observe else 0)
        await _keep_history(context.bus, settings.history_stream())
        advertiser = _packing(executor, port, writer, settings) if writer is not None else None
        if advertiser is not None:
            advertising = asyncio.create_task(
                advertiser.run(settings.batch_interval_seconds, context.stopping, clock=clock)
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
        if advertising is not None:
            advertising.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await advertising
        await port.close()


def main(argv: Sequence[str]) -> int:
    settings = parse_settings(ExecutorSettings, argv, prog="tideshift run executor")
    return run_service("executor", settings, serve)
