"""`tideshift run watcher`: Kubernetes nodes, pods and labelled workloads -> cluster events
and the KV snapshot."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Sequence
from typing import Annotated, Protocol

from pydantic import Field

from tideshift.events import SNAPSHOT_BUCKET
from tideshift.services.cluster.connect import open_kubernetes
from tideshift.services.common.clock import WALL_CLOCK, Clock
from tideshift.services.common.retry import Stopped, fixed, log_retries, retrying_async
from tideshift.services.common.runtime import ServiceContext, run_service
from tideshift.services.common.settings import ServiceSettings, parse_settings
from tideshift.services.watcher.skipped import follow_skipped
from tideshift.services.watcher.watcher import WatchedCluster, Watcher

log = logging.getLogger("tideshift.watcher")

# The first list may fail while the apiserver is still coming up: wait this long, try again.
START_RETRY = fixed(2.0)
# A Kubernetes namespace name (a DNS-1123 label): it becomes part of the API paths watched.
NAMESPACE_PATTERN = r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$"


class WatcherCluster(WatchedCluster, Protocol):
    """The cluster the service watches, and releases when it stops."""

    async def close(self) -> None: ...


class WatcherSettings(ServiceSettings):
    """Watch Kubernetes nodes and pods; publish cluster events; keep the snapshot in NATS KV."""

    kubeconfig: str | None = Field(
        default=None,
        description="kubeconfig path; unset = $KUBECONFIG or ~/.kube/config, or in-cluster",
    )
    kube_context: str | None = Field(default=None, description="kubeconfig context to use")
    namespace: str | None = Field(
        default=None, description="watch pods of this namespace only; unset = all namespaces"
    )
    namespaces: list[Annotated[str, Field(pattern=NAMESPACE_PATTERN)]] = Field(
        default_factory=list,
        description="watch these namespaces only, one watch each (with `namespace`: it too); "
        "empty = `namespace`, or all namespaces",
    )
    label_selector: str | None = Field(
        default=None, description="watch only pods matching this label selector"
    )
    resync_seconds: float = Field(
        default=300.0, gt=0, description="full relist period, seconds (publishes differences)"
    )
    skipped_events: bool = Field(
        default=True,
        description="record a Warning Event (TideshiftSkipped) on each target a plan skips",
    )
    snapshot_bucket: str = Field(
        default=SNAPSHOT_BUCKET,
        pattern=r"^[A-Za-z0-9_-]+$",
        description="NATS KV bucket holding the current cluster snapshot",
    )


async def _watch_until_stopped(watcher: Watcher, context: ServiceContext) -> None:
    """Run the watcher until the service stops (returns) or the watcher fails (raises)."""
    running = asyncio.create_task(watcher.run(context.ready))
    stop = asyncio.create_task(context.stopping.wait())
    try:
        await asyncio.wait({running, stop}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        stop.cancel()
        if not running.done():
            running.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await running
    if not context.stopping.is_set():
        running.result()  # its error, if it failed
        raise RuntimeError("the watcher stopped by itself")


async def serve(
    context: ServiceContext, *, cluster: WatcherCluster | None = None, clock: Clock = WALL_CLOCK
) -> None:
    """The service body; `cluster` replaces the Kubernetes port the settings name (the demo
    passes its simulated cluster and clock; nothing else differs)."""
    settings = context.settings
    assert isinstance(settings, WatcherSettings)
    port = cluster or await open_kubernetes(
        settings.kubeconfig,
        context=settings.kube_context,
        namespace=sorted({*settings.namespaces, *filter(None, [settings.namespace])}) or None,
        label_selector=settings.label_selector,
        resync_seconds=settings.resync_seconds,
    )
    context.readiness_checks.append(lambda: [f"not watching {name}" for name in port.unwatched()])
    watcher = Watcher(port, context.bus, bucket=settings.snapshot_bucket, clock=clock)
    retrying = retrying_async(
        START_RETRY,
        clock=clock,
        stopping=context.stopping,
        retry_on=Exception,
        before_sleep=log_retries(log, "watcher start"),
    )
    warning = (
        asyncio.create_task(follow_skipped(port, context.bus, context.stopping))
        if settings.skipped_events
        else None
    )
    try:
        with contextlib.suppress(Stopped):
            await retrying(_watch_until_stopped, watcher, context)
    finally:
        if warning is not None:
            warning.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await warning
        await port.close()


def main(argv: Sequence[str]) -> int:
    settings = parse_settings(WatcherSettings, argv, prog="tideshift run watcher")
    return run_service("watcher", settings, serve)
