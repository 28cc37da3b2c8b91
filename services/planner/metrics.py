"""What each plan saw and decided, as Prometheus gauges: the series the chart's dashboard and
alerts read (charts/tideshift/dashboards/).

Per serving workload its observed demand, the capacity of its current replicas and the
forecast for now at each quantile; per target the replicas (trainers, for a job) the plan
wants; per node the cpu that batch trainers borrow. A series whose workload, target or node
left the plan is removed, so the label sets stay as many as the cluster's objects.
"""

from __future__ import annotations

import bisect
import logging
from collections.abc import Hashable, Mapping, Sequence

import numpy as np
from prometheus_client import Counter, Gauge, Histogram

from tideshift.services.planner import core as pol
from tideshift.services.planner.core.targets import TargetBook

log = logging.getLogger("tideshift.planner")

DEMAND = Gauge(
    "tideshift_planner_demand_rps",
    "Demand observed on a serving workload (requests/s; absent while none is fresh)",
    ["namespace", "name"],
)
CAPACITY = Gauge(
    "tideshift_planner_capacity_rps",
    "Requests/s a serving workload's current replicas serve (replicas x capacity_rps)",
    ["namespace", "name"],
)
FORECAST = Gauge(
    "tideshift_planner_forecast_rps",
    "The forecast's value for now at each quantile (requests/s)",
    ["namespace", "name", "quantile"],
)
DESIRED = Gauge(
    "tideshift_planner_desired_replicas",
    "Replicas the last plan wants (trainers, for a training job)",
    ["namespace", "name", "role"],
)
INPUTS_SECONDS = Histogram(
    "tideshift_planner_inputs_seconds", "Copying the state into a plan's inputs (event loop)"
)
INGEST_LAG = Histogram(
    "tideshift_planner_ingest_lag_seconds",
    "Age of each node/pod event when the planner applied it (watcher observed -> applied)",
    buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0),
)
ANNOUNCEMENTS_SKIPPED = Counter(
    "tideshift_planner_announcements_skipped_total",
    "Workload announcements not planned: max_announced_workloads were planned already",
)
TARGETS = Gauge(
    "tideshift_planner_targets", "Serving workloads and training jobs in the latest plan"
)
CLUSTER_OBJECTS = Gauge(
    "tideshift_planner_cluster_objects", "Nodes and pods in the planner's view", ["kind"]
)
LENT = Gauge(
    "tideshift_planner_lent_cpu_cores",
    "CPU requested on a node by batch trainers, which borrow serving's idle reservation",
    ["node"],
)


# Label sets that may go before a gauge is started afresh rather than pruned one by one.
SERIES_REBUILD_SLACK = 1000


class _Series:
    """One gauge's values for the latest plan; label sets absent from it are removed."""

    def __init__(self, gauge: Gauge) -> None:
        self.gauge = gauge
        self.shown: set[tuple[str, ...]] = set()

    def show(self, values: Mapping[tuple[str, ...], float]) -> None:
        gone = self.shown - values.keys()
        # The client keeps its label sets in a dict that never shrinks: once most of them
        # are gone (a flood of workloads deleted), start it afresh instead.
        if len(gone) > len(values) + SERIES_REBUILD_SLACK:
            self.gauge.clear()
            gone = set()
        for labels, value in values.items():
            self.gauge.labels(*labels).set(value)
        for labels in gone:
            self.gauge.remove(*labels)
        self.shown = set(values)


_SERIES = {gauge: _Series(gauge) for gauge in (DEMAND, CAPACITY, FORECAST, DESIRED, LENT)}


def record(inputs: pol.PlanInputs, decision: pol.Decision, now: float) -> None:
    """Publish what this plan saw (`inputs`) and decided; `now` picks the forecast's point."""
    serving = {w.target: w for w in inputs.serving}
    _SERIES[DEMAND].show({_names(t): rps for t, rps in inputs.observed_rps.items() if t in serving})
    _SERIES[CAPACITY].show(
        {_names(t): inputs.current.get(t, 0) * w.capacity_rps for t, w in serving.items()}
    )
    _SERIES[FORECAST].show(
        {
            (*_names(target), f"{quantile:g}"): value
            for target, forecast in inputs.forecasts.items()
            if target in serving
            for quantile, value in _point(forecast, now).items()
        }
    )
    _SERIES[DESIRED].show({(*_names(d.target), d.role): d.desired for d in decision.targets})
    _SERIES[LENT].show(_lent(inputs))


def _names(target: pol.Target) -> tuple[str, str]:
    return (target.namespace, target.name)


def _point(forecast: pol.Forecast, now: float) -> dict[float, float]:
    """Each quantile's value at `now` (a value holds until the next time; before the first
    time, the first value)."""
    index = max(bisect.bisect_right(forecast.times, now) - 1, 0)
    return {
        quantile: values[index]
        for quantile, values in forecast.quantiles.items()
        if index < len(values)
    }


def _lent(inputs: pol.PlanInputs) -> dict[tuple[str, ...], float]:
    """Per node, the cpu requests of pods owned by batch jobs (every node, 0 when none)."""
    cluster = inputs.cluster
    batch: set[Hashable] = {job.target for job in inputs.jobs if job.batch}
    owned = np.array([owner in batch for owner in cluster.owners] + [False], dtype=bool)
    # pod_owner is -1 for an unowned pod: the appended False answers for it.
    borrowing = owned[cluster.pod_owner] & (cluster.pod_node >= 0)
    cpu = np.bincount(
        cluster.pod_node[borrowing],
        weights=cluster.pod_requests[borrowing, 0],
        minlength=len(cluster.node_names),
    )
    return {(node,): float(cpu[row]) for row, node in enumerate(cluster.node_names)}


# New degraded reasons logged one by one per plan; the rest are counted in one line.
LOGGED_REASONS = 10


def record_inputs(inputs: pol.PlanInputs, book: TargetBook) -> None:
    """What a plan takes in: its targets, the cluster's objects, and the announcements the
    book refused at its limit since the last plan (counted, and said)."""
    TARGETS.set(len(inputs.serving) + len(inputs.jobs))
    CLUSTER_OBJECTS.labels("node").set(len(inputs.cluster.node_names))
    CLUSTER_OBJECTS.labels("pod").set(len(inputs.cluster.pod_node))
    skipped = book.take_refused()
    if skipped:
        ANNOUNCEMENTS_SKIPPED.inc(skipped)
        log.warning(
            "%d workload announcement(s) not planned: max_announced_workloads (%d) reached; "
            "raise it or remove workloads",
            skipped,
            book.limit,
        )


def log_degraded(before: Sequence[str], reasons: Sequence[str]) -> None:
    """Log the reasons that are new since `before`, a few of them: thousands of workloads
    announced one by one would otherwise log the whole list again at every plan."""
    known = set(before)
    new = [reason for reason in reasons if reason not in known]
    for reason in new[:LOGGED_REASONS]:
        log.warning("degraded: %s", reason)
    if len(new) > LOGGED_REASONS:
        log.warning("degraded: %d more (%d in all)", len(new) - LOGGED_REASONS, len(reasons))
