"""The watcher's eye on other autoscalers: every `period_s` it lists the HPAs and KEDA
ScaledObjects of the namespaces it watches and hands them to the watcher, which holds each
labelled workload one of them targets (`cluster.core.autoscalers` decides) and announces it
again when that changes.

A listing, not a watch: autoscalers come and go rarely, a listing every 15 s costs two
requests per namespace, and it picks up a KEDA installed after the watcher started. A listing
that fails (apiserver unreachable) is logged and counted, and the last one stands; an
autoscaler that cannot be read is skipped by the lister (logged and counted there).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Protocol

from prometheus_client import Counter

from tideshift.services.cluster.core.autoscalers import Autoscaler
from tideshift.services.watcher.watcher import Watcher

log = logging.getLogger("tideshift.watcher")

LISTING_FAILURES = Counter(
    "tideshift_watcher_autoscaler_listing_failures_total",
    "Listings of HPAs and ScaledObjects that failed (the last listing stands)",
)


class AutoscalerListing(Protocol):
    @property
    def autoscalers(self) -> list[Autoscaler]: ...


class AutoscalerLister(Protocol):
    async def list_autoscalers(self) -> AutoscalerListing:
        """Every readable HPA and ScaledObject; raises when the cluster cannot answer."""
        ...


async def follow_autoscalers(
    lister: AutoscalerLister, watcher: Watcher, stopping: asyncio.Event, *, period_s: float
) -> None:
    """List other autoscalers every `period_s` and hand them to the watcher, until
    `stopping` is set; never raises."""
    while not stopping.is_set():
        try:
            listing = await lister.list_autoscalers()
            await watcher.autoscalers_changed(listing.autoscalers)
        except Exception as error:  # the last listing stands; the next one may do
            LISTING_FAILURES.inc()
            log.warning("cannot list HPAs and ScaledObjects: %s", error)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stopping.wait(), period_s)
