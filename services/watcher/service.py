"""`tideshift run watcher`: Kubernetes nodes, pods and labelled workloads -> cluster events
and the KV snapshot."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Protocol

from tideshift.services.cluster.connect import open_kubernetes
from tideshift.services.common.clock import WALL_CLOCK, Clock
from tideshift.services.common.retry import Stopped, fixed, log_retries, retrying_async
from tideshift.services.common.runtime import ServiceContext, service_main
from tideshift.services.watcher.autoscalers import AutoscalerLister, follow_autoscalers
from tideshift.services.watcher.settings import WatcherSettings
from tideshift.services.watcher.skipped import follow_skipped
from tideshift.services.watcher.watcher import WatchedCluster, Watcher

log = logging.getLogger("tideshift.watcher")

# The first list may fail while the apiserver is still coming up: wait this long, try again.
START_RETRY = fixed(2.0)


class WatcherCluster(WatchedCluster, Protocol):
    """The cluster the service watches, and releases when it stops."""

    async def close(self) -> None: ...


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
    settings: WatcherSettings,
    context: ServiceContext,
    *,
    clock: Clock = WALL_CLOCK,
    cluster: WatcherCluster | None = None,
) -> None:
    """The service body; `cluster` replaces the Kubernetes port the settings name (the demo
    passes its simulated cluster and clock; nothing else differs)."""
    port: WatcherCluster
    lister: AutoscalerLister | None = None
    if cluster is not None:
        port = cluster
    else:
        kube = await open_kubernetes(
            settings.kubeconfig,
            context=settings.kube_context,
            namespace=sorted({*settings.namespaces, *filter(None, [settings.namespace])}) or None,
            label_selector=settings.label_selector,
            resync_seconds=settings.resync_seconds,
        )
        port = kube
        if settings.other_autoscalers:
            lister = kube.autoscalers()
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
    autoscalers = (
        asyncio.create_task(
            follow_autoscalers(
                lister, watcher, context.stopping, period_s=settings.autoscalers_period_seconds
            )
        )
        if lister is not None
        else None
    )
    try:
        with contextlib.suppress(Stopped):
            await retrying(_watch_until_stopped, watcher, context)
    finally:
        for task in (warning, autoscalers):
            if task is None:
                continue
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await port.close()


main = service_main("watcher", WatcherSettings, serve)

__all__ = ["WatcherSettings", "main", "serve"]
