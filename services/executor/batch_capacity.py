"""Lending serving's idle reservation: per node, what non-batch pods request but do not use,
within allocatable - what they use - a margin (`cluster.core.overcommit.lendable`, the planner's
definition too), advertised as the extended resources `tideshift.io/batch-cpu` (millicores)
and `tideshift.io/batch-memory` (bytes) on each Node's status. Trainers that opt in request
those instead of cpu/memory and run below serving; when serving's usage rises, what is
advertised shrinks with it. Room no request holds is not advertised: a pod on requests may
bind there at any moment."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
from collections.abc import Mapping
from typing import Any, Protocol

import numpy as np
from prometheus_api_client import PrometheusConnect
from prometheus_api_client.exceptions import PrometheusApiClientException
from prometheus_client import Counter, Gauge
from requests.exceptions import RequestException
from urllib3 import Retry

from tideshift.services.cluster.core.overcommit import (
    BATCH_CPU,
    BATCH_MEMORY,
    OvercommitConfig,
    idle_reservation,
    lendable,
)
from tideshift.services.cluster.port import ClusterError
from tideshift.services.common.clock import WALL_CLOCK, Clock, wait_for_event
from tideshift.services.executor.compaction import ClusterListing

log = logging.getLogger("tideshift.executor")

ADVERTISED = Gauge(
    "tideshift_batch_cpu_cores", "Reclaimable cpu advertised as tideshift.io/batch-cpu", ["node"]
)
USAGE_ERRORS = Counter(
    "tideshift_batch_usage_errors_total", "Non-batch usage reads that failed or were malformed"
)
WRITE_ERRORS = Counter(
    "tideshift_batch_write_errors_total", "Node status writes of batch resources that failed"
)


class UsageError(RuntimeError):
    """Non-batch usage could not be read."""


class NodeUsage(Protocol):
    async def non_batch_usage(self) -> Mapping[str, tuple[float, float]]:
        """Per node name: (cpu cores, memory bytes) used by every pod that is not batch."""
        ...


class NodeResourceWriter(Protocol):
    async def set_node_resources(self, node: str, amounts: Mapping[str, int]) -> None: ...


class PrometheusNodeUsage:
    """Non-batch usage from two instant PromQL queries whose series carry a `node` label."""

    def __init__(self, url: str, *, cpu_query: str, memory_query: str, timeout_s: float) -> None:
        self.url = url
        self.queries = (cpu_query, memory_query)
        self.timeout_s = timeout_s
        self._client = PrometheusConnect(
            url=url, disable_ssl=True, retry=Retry(total=0), timeout=math.ceil(timeout_s)
        )

    async def non_batch_usage(self) -> Mapping[str, tuple[float, float]]:
        cpu, memory = [await self._by_node(query) for query in self.queries]
        return {node: (cpu.get(node, 0.0), memory.get(node, 0.0)) for node in cpu.keys() | memory}

    async def _by_node(self, query: str) -> dict[str, float]:
        try:
            result = await asyncio.wait_for(
                asyncio.to_thread(self._client.custom_query, query), self.timeout_s + 1.0
            )
        except TimeoutError:
            raise UsageError(f"Prometheus at {self.url} did not answer in time") from None
        except (RequestException, PrometheusApiClientException) as error:
            raise UsageError(f"Prometheus at {self.url}: {error}") from error
        return parse_by_node(result, query)


def parse_by_node(result: Any, query: str) -> dict[str, float]:
    """An instant vector -> {node: value}; UsageError naming what was expected."""
    if not isinstance(result, list):
        raise UsageError(
            f"{query}: expected an instant vector (a list), got {type(result).__name__}"
        )
    values: dict[str, float] = {}
    for index, series in enumerate(result):
        try:
            node = series["metric"]["node"]
            value = float(series["value"][1])
        except (KeyError, IndexError, TypeError, ValueError) as error:
            raise UsageError(
                f"{query}: series {index}: expected metric.node and a numeric value ({error!r})"
            ) from error
        if not math.isfinite(value) or value < 0:
            raise UsageError(f"{query}: series {index}: expected a finite usage >= 0, got {value}")
        values[str(node)] = values.get(str(node), 0.0) + value
    return values


class BatchAdvertiser:
    """Writes what each node lends when it changed since the last write."""

    def __init__(
        self,
        port: ClusterListing,
        writer: NodeResourceWriter,
        usage: NodeUsage,
        config: OvercommitConfig,
    ) -> None:
        self.port, self.writer, self.usage, self.config = port, writer, usage, config
        self.advertised: dict[str, dict[str, int]] = {}

    async def advertise_once(self) -> dict[str, dict[str, int]]:
        """One pass; returns what each schedulable node now advertises. A node missing from the
        usage lends nothing (its usage is unknown)."""
        nodes = [node for node in await self.port.list_nodes() if node.schedulable]
        used_by_node = await self.usage.non_batch_usage()
        # Batch trainers request only the extended resources: their cpu / memory requests are
        # none, so these sums are what non-batch pods reserve.
        requested_by_node: dict[str, tuple[float, float]] = {}
        for pod in await self.port.list_pods():
            if pod.node is None or pod.deleting or pod.phase not in ("Pending", "Running"):
                continue
            cpu, memory = requested_by_node.get(pod.node, (0.0, 0.0))
            requested_by_node[pod.node] = (cpu + pod.requests.cpu, memory + pod.requests.memory)
        allocatable = np.array(
            [(node.allocatable.cpu, node.allocatable.memory) for node in nodes]
        ).reshape(-1, 2)
        # a node whose usage is unknown counts as fully used: it lends nothing
        used = np.array(
            [
                used_by_node.get(node.name, (node.allocatable.cpu, node.allocatable.memory))
                for node in nodes
            ]
        ).reshape(-1, 2)
        requested = np.array(
            [requested_by_node.get(node.name, (0.0, 0.0)) for node in nodes]
        ).reshape(-1, 2)
        lent = lendable(allocatable, used, idle_reservation(requested, used), self.config)
        for node, (cpu, memory) in zip(nodes, lent.tolist(), strict=True):
            amounts = {BATCH_CPU: int(cpu * 1000), BATCH_MEMORY: int(memory)}
            if self.advertised.get(node.name) == amounts:
                continue
            try:
                await self.writer.set_node_resources(node.name, amounts)
            except (KeyError, ClusterError) as error:
                WRITE_ERRORS.inc()
                log.warning("could not advertise batch resources on %s: %s", node.name, error)
                continue
            self.advertised[node.name] = amounts
            ADVERTISED.labels(node.name).set(cpu)
        self._forget_all_but({node.name for node in nodes})
        return dict(self.advertised)

    def _forget_all_but(self, names: set[str]) -> None:
        """Drop what was advertised on nodes gone or no longer schedulable (and their gauge
        series): what is kept per node name stays bounded by the cluster's nodes."""
        for name in [name for name in self.advertised if name not in names]:
            del self.advertised[name]
            with contextlib.suppress(KeyError):
                ADVERTISED.remove(name)

    async def run(
        self, interval_s: float, stopping: asyncio.Event, *, clock: Clock = WALL_CLOCK
    ) -> None:
        """Advertise every `interval_s` of `clock` until `stopping`; a failed pass is logged
        and counted."""
        while not stopping.is_set():
            try:
                await self.advertise_once()
            except (UsageError, ClusterError) as error:
                USAGE_ERRORS.inc()
                log.warning("batch resources not advertised this time: %s", error)
            if await wait_for_event(clock, stopping, interval_s):
                return
