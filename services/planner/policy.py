"""Tideshift's capacity policy: serving first from the forecast, the rest to elastic training.

`plan(inputs, state, now) -> (decision, new_state)` is pure: no clock, no I/O. Same inputs,
same state, same `now` give the same decision, so every decision can be replayed.

The model (DESIGN.md, "The planner's model"):

1. Serving. replicas = ceil(peak of the forecast quantile over [now, now + lead + margin] /
   per-replica capacity at target utilisation), clamped to [min, max]. Up at once; down only to
   the highest recommendation of the last `stabilization_s` (so a single dip never scales
   down). After a restart nothing goes down until a whole window has been observed.
2. Training. What serving and unmanaged pods leave goes to elastic jobs, tier by tier (higher
   priority first). Within a tier: weighted dominant-resource fairness by water-filling a
   level L, trainers(j) = clamp(floor(L * weight_j / dominant_share_j), min_j, max_j). A job
   whose gang minimum cannot be placed gets 0 (a partial gang only wastes capacity).
3. Every allocation is checked per node: pods that stay keep their nodes, additions are packed
   per request shape (GPU shapes first) into what each node has left. Shrinking a workload is
   modelled as removing pods from the nodes that hold most of them (as the ReplicaSet does).
4. Churn. Removals that only rebalance training (not forced by serving or a higher tier) are
   capped per step, wait until the job's last growth is `min_trainer_lifetime_s` old, and are
   skipped when smaller than `shrink_tolerance` of the job (no ±1 flapping), unless a held
   trainer would keep another job below its gang minimum. A running job's growth by at most
   `grow_tolerance` of its size waits too.

Inputs come in columnar form (`ClusterView`, numpy arrays) so a plan over 5,000 nodes and
150,000 pods stays well under 100 ms; `ClusterView.build` makes one from plain records.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

import numpy as np
import numpy.typing as npt

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]
BoolArray = npt.NDArray[np.bool_]

# (cpu cores, memory bytes, nvidia.com/gpu)
Vector = tuple[float, float, float]
RESOURCE_NAMES = ("cpu", "memory", "gpu")
_EPS = 1e-9
# The forecast quantile a serving workload is sized for unless it says otherwise.
DEFAULT_SERVING_QUANTILE = 0.95


@dataclass(frozen=True, slots=True, order=True)
class Target:
    namespace: str
    kind: str
    name: str

    def __str__(self) -> str:
        return f"{self.namespace}/{self.kind}/{self.name}"


# ---- inputs --------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class NodeSpec:
    name: str
    allocatable: Vector
    schedulable: bool = True


@dataclass(frozen=True, slots=True)
class PodSpec:
    requests: Vector
    node: str | None = None  # None: not bound yet
    owner: Target | None = None
    replica: bool = True  # False for a job's fixed companions (parameter servers)


@dataclass(frozen=True, slots=True, eq=False)
class ClusterView:
    """Nodes and pods as arrays. Rows of unschedulable nodes have zero allocatable."""

    node_names: tuple[str, ...]
    allocatable: FloatArray  # (nodes, 3)
    owners: tuple[Target, ...]
    pod_node: IntArray  # (pods,) node row, -1 when unbound
    pod_requests: FloatArray  # (pods, 3)
    pod_owner: IntArray  # (pods,) index into owners, -1 when unowned
    pod_replica: BoolArray  # (pods,)

    @classmethod
    def build(cls, nodes: Iterable[NodeSpec], pods: Iterable[PodSpec]) -> ClusterView:
        node_list = list(nodes)
        node_row = {node.name: row for row, node in enumerate(node_list)}
        allocatable = np.array(
            [node.allocatable if node.schedulable else (0.0, 0.0, 0.0) for node in node_list],
            dtype=np.float64,
        ).reshape(-1, 3)
        owner_row: dict[Target, int] = {}
        pod_node: list[int] = []
        pod_requests: list[Vector] = []
        pod_owner: list[int] = []
        pod_replica: list[bool] = []
        for pod in pods:
            pod_node.append(node_row.get(pod.node, -1) if pod.node is not None else -1)
            pod_requests.append(pod.requests)
            if pod.owner is None:
                pod_owner.append(-1)
            else:
                pod_owner.append(owner_row.setdefault(pod.owner, len(owner_row)))
            pod_replica.append(pod.replica)
        return cls(
            node_names=tuple(node.name for node in node_list),
            allocatable=allocatable,
            owners=tuple(owner_row),
            pod_node=np.array(pod_node, dtype=np.int64),
            pod_requests=np.array(pod_requests, dtype=np.float64).reshape(-1, 3),
            pod_owner=np.array(pod_owner, dtype=np.int64),
            pod_replica=np.array(pod_replica, dtype=np.bool_),
        )


@dataclass(frozen=True, slots=True)
class ServingWorkload:
    target: Target
    replica_requests: Vector
    capacity_rps: float  # requests/s one replica serves at the target utilisation
    min_replicas: int = 1
    max_replicas: int = 1000
    lead_time_s: float = 60.0  # pod start-up until ready
    margin_s: float = 60.0  # extra look-ahead beyond the lead time
    stabilization_s: float = 300.0  # scale-down waits for the window's highest recommendation
    quantile: float = DEFAULT_SERVING_QUANTILE  # which forecast quantile sizes the workload


@dataclass(frozen=True, slots=True)
class Forecast:
    """Demand in requests/s; quantile q's value at times[i] holds until times[i + 1]."""

    issued_at: float
    times: tuple[float, ...]
    quantiles: Mapping[float, tuple[float, ...]]


@dataclass(frozen=True, slots=True)
class TrainingJob:
    target: Target
    trainer_requests: Vector
    min_trainers: int
    max_trainers: int
    gang_min: int | None = None  # trainers that must be placed together; default min_trainers
    priority: int = 0  # higher tiers are served first
    weight: float = 1.0  # fair-share weight within a tier
    submitted_at: float = 0.0  # earlier jobs are admitted first when not all gangs fit
    nominal_trainers: int | None = None  # what a non-elastic submission asks; default max

    @property
    def nominal(self) -> int:
        return self.nominal_trainers if self.nominal_trainers is not None else self.max_trainers

    @property
    def floor(self) -> int:
        """The smallest useful trainer count."""
        return max(self.min_trainers, self.gang_min or 0, 1)


@dataclass(frozen=True, slots=True)
class PolicyConfig:
    max_forecast_age_s: float = 600.0  # older forecasts are stale: hold that workload
    max_trainer_removals_per_step: int = 64  # voluntary (rebalancing) removals, all jobs
    min_trainer_lifetime_s: float = 60.0  # no voluntary shrink sooner after a job grew
    shrink_tolerance: float = 0.05  # voluntary shrinks of at most this fraction are skipped
    grow_tolerance: float = 0.05  # growth of a running job by at most this fraction waits


@dataclass(frozen=True, slots=True)
class PlanInputs:
    cluster: ClusterView
    serving: tuple[ServingWorkload, ...]
    jobs: tuple[TrainingJob, ...]
    forecasts: Mapping[Target, Forecast]
    current: Mapping[Target, int]  # desired replicas in each target's spec now
    config: PolicyConfig = field(default_factory=PolicyConfig)
    cluster_stale: bool = False  # the watcher went quiet: hold serving, stop growing training
    observed_rps: Mapping[Target, float] = field(default_factory=dict)  # for reactive baselines


# ---- state and decision ---------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class PlanState:
    # (time, recommended replicas) within each serving workload's stabilisation window
    serving_history: Mapping[Target, tuple[tuple[float, int], ...]] = field(default_factory=dict)
    serving_seen_since: Mapping[Target, float] = field(default_factory=dict)
    job_grew_at: Mapping[Target, float] = field(default_factory=dict)


Role = Literal["serving", "training"]


@dataclass(frozen=True, slots=True)
class TargetDecision:
    target: Target
    role: Role
    current: int
    desired: int
    reason: str

    @property
    def changed(self) -> bool:
        return self.desired != self.current


@dataclass(frozen=True, slots=True)
class Infeasible:
    target: Target
    reason: str


@dataclass(frozen=True, slots=True, eq=False)
class Decision:
    targets: tuple[TargetDecision, ...]
    infeasible: tuple[Infeasible, ...]
    fallbacks: tuple[str, ...]  # safe-mode announcements (stale inputs)
    node_usage: FloatArray  # (nodes, 3): requests the plan places on each node

    def desired(self) -> dict[Target, int]:
        return {item.target: item.desired for item in self.targets}

    def changes(self) -> tuple[TargetDecision, ...]:
        return tuple(item for item in self.targets if item.changed)


# ---- packing helpers --------------------------------------------------------------------------


def slots_per_node(free: FloatArray, request: FloatArray) -> IntArray:
    """How many pods of `request` fit on each node's free resources."""
    positive = request > 0
    if not positive.any():
        return np.full(free.shape[0], 1 << 30, dtype=np.int64)
    ratios = np.floor((free[:, positive] + 1e-6) / request[positive])
    slots: IntArray = np.maximum(ratios.min(axis=1), 0).astype(np.int64)
    return slots


def pack_sparse(free: FloatArray, request: FloatArray, count: int) -> tuple[IntArray, IntArray]:
    """First fit of `count` identical pods: (node rows, pods on each); the sum may fall short.

    Scans nodes in growing blocks and stops once everything is placed: small additions on a
    big cluster touch only the first few hundred nodes.
    """
    node_count = free.shape[0]
    nodes: list[IntArray] = []
    counts: list[IntArray] = []
    start, block = 0, 256
    while count > 0 and start < node_count:
        end = min(node_count, start + block)
        slots = slots_per_node(free[start:end], request)
        before = np.cumsum(slots) - slots
        taken = np.clip(count - before, 0, slots)
        used = np.flatnonzero(taken)
        nodes.append(used + start)
        counts.append(taken[used])
        count -= int(taken.sum())
        start, block = end, block * 2
    if not nodes:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    return np.concatenate(nodes), np.concatenate(counts)


def pack(free: FloatArray, request: FloatArray, count: int) -> IntArray:
    """First fit of `count` identical pods; returns pods per node (sum may fall short)."""
    placed: IntArray = np.zeros(free.shape[0], dtype=np.int64)
    nodes, counts = pack_sparse(free, request, count)
    placed[nodes] = counts
    return placed


def level_down(counts: IntArray, keep: int) -> IntArray:
    """Keep `keep` pods, removing first from the nodes that hold the most."""
    total = int(counts.sum())
    if keep >= total:
        return counts
    if keep <= 0:
        return np.zeros(counts.shape, dtype=np.int64)
    low, high = 0, int(counts.max())
    while low < high:  # largest cap h with sum(min(counts, h)) <= keep
        middle = (low + high + 1) // 2
        if int(np.minimum(counts, middle).sum()) <= keep:
            low = middle
        else:
            high = middle - 1
    kept = np.minimum(counts, low)
    remainder = keep - int(kept.sum())
    if remainder > 0:
        above = np.flatnonzero(counts > low)[:remainder]
        kept[above] += 1
    return kept


def level_down_many(counts: IntArray, rows: IntArray, row_count: int, keep: IntArray) -> IntArray:
    """`level_down` for many targets at once.

    Entries (rows[e], counts[e]) are one target's pods on one node, grouped by row in
    ascending order; `keep[row]` pods stay per target. A vectorised binary search finds each
    target's cap h (largest with sum(min(counts, h)) <= keep); the remainder goes, one each,
    to that target's first entries above h. Worked example (test_level_down_many): counts
    [4, 1, 2] with keep 5 gives h = 2, sum 5, stays [2, 1, 2].
    """
    if counts.size == 0:
        return counts.copy()
    totals = np.bincount(rows, weights=counts, minlength=row_count).astype(np.int64)
    keep = np.clip(keep, 0, totals)
    cut = keep < totals
    if not cut.any():
        return counts.copy()
    affected = cut[rows]
    if not affected.all():  # only the targets that shrink need the search
        result_all = counts.copy()
        result_all[affected] = level_down_many(counts[affected], rows[affected], row_count, keep)
        return result_all
    low = np.zeros(row_count, dtype=np.int64)
    high = np.zeros(row_count, dtype=np.int64)
    np.maximum.at(high, rows, counts)
    for _ in range(64):
        if np.all(low >= high):
            break
        middle = (low + high + 1) // 2
        sums = np.bincount(rows, weights=np.minimum(counts, middle[rows]), minlength=row_count)
        fits = sums <= keep + 1e-9
        low = np.where(fits, middle, low)
        high = np.where(fits, high, middle - 1)
    stays = np.minimum(counts, low[rows])
    remainder = keep - np.bincount(rows, weights=stays, minlength=row_count).astype(np.int64)
    above = counts > low[rows]
    running = np.cumsum(above)
    starts = np.searchsorted(rows, np.arange(row_count))
    before_row = np.where(starts > 0, running[np.maximum(starts - 1, 0)], 0)
    rank = running - 1 - before_row[rows]
    stays += (above & (rank < remainder[rows])).astype(np.int64)
    result: IntArray = stays
    return result


def node_sums(
    nodes: IntArray, weights: IntArray, requests: FloatArray, node_count: int
) -> FloatArray:
    """Per-node resources of `weights[e]` pods of `requests[e]` on `nodes[e]`: (nodes, 3)."""
    result = np.zeros((node_count, 3))
    if nodes.size:
        for resource in range(3):
            result[:, resource] = np.bincount(
                nodes, weights=weights * requests[:, resource], minlength=node_count
            )
    return result


# ---- serving ------------------------------------------------------------------------------------


def forecast_peak(forecast: Forecast, start: float, end: float, quantile: float) -> float | None:
    """Highest value of the closest quantile >= `quantile` over [start, end].

    None when the forecast has no point in force during the window (it ends before `start`,
    or starts after `end`).
    """
    available = sorted(forecast.quantiles)
    if not available or not forecast.times:
        return None
    chosen = next((q for q in available if q >= quantile - 1e-12), available[-1])
    values = forecast.quantiles[chosen]
    times = forecast.times
    step = times[1] - times[0] if len(times) > 1 else 0.0
    if times[0] > end or times[-1] + step < start:
        return None
    # The point in force at `start` is the last one at or before it.
    first = max(bisect.bisect_right(times, start) - 1, 0)
    last = bisect.bisect_right(times, end)
    return float(max(values[first:last]))


def _plan_serving(
    workload: ServingWorkload,
    forecast: Forecast | None,
    *,
    current: int,
    history: tuple[tuple[float, int], ...],
    seen_since: float,
    now: float,
    config: PolicyConfig,
    cluster_stale: bool,
) -> tuple[int, str, tuple[tuple[float, int], ...], str | None]:
    """Returns (desired, reason, new history, fallback announcement or None)."""
    window_end = now + workload.lead_time_s + workload.margin_s
    peak: float | None = None
    if forecast is not None and now - forecast.issued_at <= config.max_forecast_age_s:
        peak = forecast_peak(forecast, now, window_end, workload.quantile)
    if peak is None:
        held = min(max(current, workload.min_replicas), workload.max_replicas)
        why = "no forecast" if forecast is None else "forecast stale or not covering the window"
        return held, f"holding {held}: {why}", history, f"{workload.target}: {why}; holding"
    need = math.ceil(max(peak, 0.0) / workload.capacity_rps - 1e-9)
    recommended = min(max(need, workload.min_replicas), workload.max_replicas)
    basis = (
        f"forecast q{workload.quantile:g} peak {peak:.1f} req/s over the next "
        f"{workload.lead_time_s + workload.margin_s:.0f} s / {workload.capacity_rps:g} req/s "
        f"per replica = {need}"
    )
    if recommended != need:
        basis += f", clamped to [{workload.min_replicas}, {workload.max_replicas}]"
    cutoff = now - workload.stabilization_s
    new_history = (*(item for item in history if item[0] > cutoff), (now, recommended))
    stabilized = max(value for _, value in new_history)
    if recommended >= current:
        return (
            recommended,
            f"{basis}; scale up now" if recommended > current else basis,
            (new_history),
            None,
        )
    if cluster_stale:
        return current, f"{basis}; cluster view stale: not scaling down", new_history, None
    if now - seen_since < workload.stabilization_s:
        return (
            current,
            f"{basis}; no scale-down until {workload.stabilization_s:.0f} s observed",
            new_history,
            None,
        )
    if stabilized < current:
        return (
            stabilized,
            f"{basis}; scale down to the highest recommendation of the last "
            f"{workload.stabilization_s:.0f} s",
            new_history,
            None,
        )
    return current, f"{basis}; scale-down held by the stabilisation window", new_history, None


# ---- training -----------------------------------------------------------------------------------


@dataclass(slots=True)
class _TierJob:
    job: TrainingJob
    current: int
    request: FloatArray
    kept_total: int  # trainers that stay where they are (after forced clipping)
    dominant: float  # dominant share of one trainer in the cluster
    lo: int = 0
    hi: int = 0


def _shape_order(jobs: Sequence[_TierJob]) -> list[tuple[tuple[float, float, float], list[int]]]:
    shapes: dict[tuple[float, float, float], list[int]] = {}
    for index, item in enumerate(jobs):
        key = (float(item.request[0]), float(item.request[1]), float(item.request[2]))
        shapes.setdefault(key, []).append(index)
    # GPU shapes first (the scarcest, most fragmented resource), then bigger before smaller.
    return sorted(shapes.items(), key=lambda entry: (-entry[0][2], -entry[0][0], -entry[0][1]))


class _TierSolver:
    """Feasibility and fair-share search for one priority tier."""

    def __init__(
        self,
        jobs: list[_TierJob],
        base_free: FloatArray,
        *,
        entry_job: IntArray,
        entry_node: IntArray,
        entry_kept: IntArray,
    ) -> None:
        """`base_free`: room left with every kept trainer in place; entries (sorted by job):
        the kept trainers per (job, node)."""
        self.jobs = jobs
        self.base_free = base_free
        self.shapes = _shape_order(jobs)
        self.entry_job = entry_job
        self.entry_node = entry_node
        self.entry_kept = entry_kept
        self.entry_request = (
            np.array([item.request for item in jobs], dtype=np.float64).reshape(-1, 3)[entry_job]
            if jobs
            else np.zeros((0, 3))
        )
        self.kept_totals = np.array([item.kept_total for item in jobs], dtype=np.int64)

    def freed(self, counts: Sequence[int]) -> FloatArray:
        """Room once every job that shrinks has left the nodes holding most of its trainers."""
        wanted = np.asarray(counts, dtype=np.int64)
        if not np.any(wanted < self.kept_totals):
            return self.base_free.copy()
        stays = level_down_many(self.entry_kept, self.entry_job, len(self.jobs), wanted)
        released = self.entry_kept - stays
        moved = released > 0
        return self.base_free + node_sums(
            self.entry_node[moved],
            released[moved],
            self.entry_request[moved],
            self.base_free.shape[0],
        )

    def place(self, counts: Sequence[int]) -> tuple[bool, FloatArray, IntArray]:
        """(all placed, free left, unplaced additions per job)."""
        free = self.freed(counts)
        unplaced = np.zeros(len(self.jobs), dtype=np.int64)
        for shape, members in self.shapes:
            additions = [max(0, counts[i] - self.jobs[i].kept_total) for i in members]
            wanted = sum(additions)
            if wanted == 0:
                continue
            request = np.asarray(shape, dtype=np.float64)
            nodes, placed = pack_sparse(free, request, wanted)
            free[nodes] -= placed[:, None] * request
            short = wanted - int(placed.sum())
            # Attribute a shortfall to the shape's last members (later-submitted jobs).
            for i, added in reversed(list(zip(members, additions, strict=True))):
                if short <= 0:
                    break
                miss = min(short, added)
                unplaced[i] = miss
                short -= miss
        return bool(unplaced.sum() == 0), free, unplaced

    def feasible(self, counts: Sequence[int]) -> bool:
        return self.place(counts)[0]

    def admit(self, order: list[int]) -> tuple[list[int], set[int]]:
        """Counts at each admitted job's floor; jobs whose gang cannot be placed get 0."""
        counts = [0] * len(self.jobs)
        excluded: set[int] = set()
        for index in order:
            if self.jobs[index].hi <= 0 or self.jobs[index].hi < self.jobs[index].lo:
                excluded.add(index)
        candidates = [i for i in order if i not in excluded]
        for i in candidates:
            counts[i] = self.jobs[i].lo
        if self.feasible(counts):
            return counts, excluded
        # Admit the longest feasible prefix (binary search), skip the job that breaks it, and
        # continue with the rest: a smaller gang further down may still fit.
        admitted: list[int] = []
        remaining = candidates
        for _ in range(32):
            if not remaining:
                break
            low, high = 0, len(remaining)
            while low < high:
                middle = (low + high + 1) // 2
                trial = [0] * len(self.jobs)
                for i in admitted + remaining[:middle]:
                    trial[i] = self.jobs[i].lo
                if self.feasible(trial):
                    low = middle
                else:
                    high = middle - 1
            admitted += remaining[:low]
            if low < len(remaining):
                excluded.add(remaining[low])
            remaining = remaining[low + 1 :]
        excluded.update(remaining)
        counts = [0] * len(self.jobs)
        for i in admitted:
            counts[i] = self.jobs[i].lo
        return counts, excluded

    def fill(self, admitted: Sequence[int], base: Sequence[int]) -> list[int]:
        """Highest level L whose fair counts still pack, then single-trainer top-ups.

        Counts only change at breakpoints L = n * dominant / weight, so the search runs over
        those: first against the tier's aggregate room (cheap), then per node (binary search
        below the aggregate bound; usually the bound itself packs).
        """
        if not admitted:
            return list(base)
        rows = np.asarray(admitted, dtype=np.int64)
        lo = np.array([self.jobs[i].lo for i in admitted], dtype=np.float64)
        hi = np.array([self.jobs[i].hi for i in admitted], dtype=np.float64)
        slope = np.array(
            [self.jobs[i].job.weight / self.jobs[i].dominant for i in admitted], dtype=np.float64
        )
        requests = np.array([self.jobs[i].request for i in admitted], dtype=np.float64)
        base_array = np.asarray(base, dtype=np.int64)

        def fair(level: float) -> IntArray:
            counts: IntArray = np.clip(np.floor(level * slope + 1e-9), lo, hi).astype(np.int64)
            return counts

        def counts_at(level: float) -> list[int]:
            counts = base_array.copy()
            counts[rows] = fair(level)
            return [int(c) for c in counts]

        room = self.base_free.sum(axis=0) + self.kept_totals @ np.array(
            [item.request for item in self.jobs]
        ).reshape(-1, 3)
        others = np.ones(len(self.jobs), dtype=np.bool_)
        others[rows] = False
        fixed_use = sum(
            (base_array[i] * self.jobs[i].request for i in np.flatnonzero(others)),
            np.zeros(3),
        )

        def fits_aggregate(level: float) -> bool:
            need = fair(level) @ requests + fixed_use
            return bool(np.all(need <= room + 1e-6))

        def aggregate_level() -> float:
            """Highest L whose fair counts fit the tier's room in total (bisection)."""
            low, high = 0.0, float((hi / slope).max()) + 1e-9
            low_total, high_total = int(fair(low).sum()), int(fair(high).sum())
            if fits_aggregate(high):
                return high
            for _ in range(80):
                # At a breakpoint the two ends keep differing by one trainer: close enough,
                # the top-ups below decide that last trainer.
                if high_total - low_total <= 1 or high - low <= 1e-9 * high:
                    break  # (several jobs may share a breakpoint: then the width decides)
                middle = (low + high) / 2
                middle_total = int(fair(middle).sum())
                if fits_aggregate(middle):
                    low, low_total = middle, middle_total
                else:
                    high, high_total = middle, middle_total
            return low

        # Progressive filling: raise the level to the aggregate bound, then freeze every job
        # whose additions did not pack (per node) at what did, and raise the others again.
        # A job blocked by its shape (GPUs, fragmentation) then no longer holds back the rest.
        best: list[int] | None = None
        for _ in range(8):
            candidate = counts_at(aggregate_level())
            placed_all, _, unplaced = self.place(candidate)
            if placed_all:
                best = candidate
                break
            frozen = False
            for position, i in enumerate(admitted):
                if unplaced[i] > 0:
                    cap = max(lo[position], candidate[i] - int(unplaced[i]))
                    if cap < hi[position]:
                        hi[position] = cap
                        frozen = True
            if not frozen:
                break
        if best is None:
            # Fall back to bisection per node, down from the last aggregate bound.
            top, low = aggregate_level(), 0.0
            top_total, low_total = int(fair(top).sum()), int(fair(low).sum())
            for _ in range(60):
                if top_total - low_total <= max(1, len(admitted) // 2) or top - low <= 1e-9 * top:
                    break
                middle = (low + top) / 2
                middle_total = int(fair(middle).sum())
                if self.feasible(counts_at(middle)):
                    low, low_total = middle, middle_total
                else:
                    top, top_total = middle, middle_total
            best = counts_at(low)
        # Integer rounding leaves room for single trainers: add them to the jobs with the lowest
        # weighted share first, each checked against its own shape's free slots.
        _, free, _ = self.place(best)
        by_share = sorted(
            admitted,
            key=lambda i: (best[i] * self.jobs[i].dominant / self.jobs[i].job.weight, i),
        )
        slots_by_shape = {
            shape: slots_per_node(free, np.asarray(shape, dtype=np.float64))
            for shape, _ in self.shapes
        }
        for i in by_share:
            item = self.jobs[i]
            if best[i] >= item.hi or best[i] < item.kept_total:
                continue
            shape = (float(item.request[0]), float(item.request[1]), float(item.request[2]))
            nodes = np.flatnonzero(slots_by_shape[shape] > 0)
            if len(nodes) == 0:
                continue
            node = int(nodes[0])
            free[node] -= item.request
            for other, slots in slots_by_shape.items():
                slots[node] = slots_per_node(free[node : node + 1], np.asarray(other))[0]
            best[i] += 1
        return best


# ---- plan ---------------------------------------------------------------------------------


def managed_targets(inputs: PlanInputs) -> list[Target]:
    """Serving workloads then jobs: the row order of `cluster_usage`'s counts."""
    return [w.target for w in inputs.serving] + [j.target for j in inputs.jobs]


@dataclass(frozen=True, slots=True, eq=False)
class ClusterEntries:
    """Requests of pods the plan does not scale, per node, and bound replicas of each managed
    target (rows: serving workloads, then jobs) as sparse (row, node, count) entries sorted by
    row then node."""

    fixed: FloatArray  # (nodes, 3)
    row: IntArray
    node: IntArray
    count: IntArray
    row_totals: IntArray  # (managed,)


def cluster_entries(inputs: PlanInputs) -> ClusterEntries:
    view = inputs.cluster
    node_count = len(view.node_names)
    managed = managed_targets(inputs)
    managed_row = {target: row for row, target in enumerate(managed)}
    # owner index (+1 so that "unowned" -1 maps to slot 0) -> managed row or -1
    owner_to_managed = np.full(len(view.owners) + 1, -1, dtype=np.int64)
    for owner_index, owner in enumerate(view.owners):
        owner_to_managed[owner_index + 1] = managed_row.get(owner, -1)
    pod_managed = owner_to_managed[view.pod_owner + 1]
    bound = view.pod_node >= 0
    managed_replica = (pod_managed >= 0) & view.pod_replica
    fixed_mask = bound & ~managed_replica
    fixed = np.zeros((node_count, 3))
    fixed_nodes = view.pod_node[fixed_mask]
    fixed_requests = view.pod_requests[fixed_mask]
    for resource in range(3):
        fixed[:, resource] = np.bincount(
            fixed_nodes, weights=fixed_requests[:, resource], minlength=node_count
        )[:node_count]
    counted = bound & managed_replica
    keys = np.sort(pod_managed[counted] * max(node_count, 1) + view.pod_node[counted])
    if keys.size:
        starts = np.flatnonzero(np.r_[True, keys[1:] != keys[:-1]])
        unique = keys[starts]
        count = np.diff(np.r_[starts, keys.size]).astype(np.int64)
    else:
        unique = count = np.zeros(0, dtype=np.int64)
    row = unique // max(node_count, 1)
    totals = np.bincount(row, weights=count, minlength=len(managed)).astype(np.int64)
    return ClusterEntries(fixed, row, unique % max(node_count, 1), count, totals)


def cluster_usage(inputs: PlanInputs) -> tuple[FloatArray, IntArray]:
    """(requests per node of pods the plan does not scale, bound replicas per managed target
    per node, dense). For small clusters (the baselines); the policy uses `cluster_entries`."""
    entries = cluster_entries(inputs)
    counts = np.zeros((len(managed_targets(inputs)), entries.fixed.shape[0]), dtype=np.int64)
    counts[entries.row, entries.node] = entries.count
    return entries.fixed, counts


def plan(inputs: PlanInputs, state: PlanState, now: float) -> tuple[Decision, PlanState]:
    config = inputs.config
    view = inputs.cluster
    node_count = len(view.node_names)
    allocatable = view.allocatable
    total = allocatable.sum(axis=0) if node_count else np.zeros(3)

    managed_row = {target: row for row, target in enumerate(managed_targets(inputs))}
    entries = cluster_entries(inputs)
    fixed = entries.fixed

    decisions: list[TargetDecision] = []
    infeasible: list[Infeasible] = []
    fallbacks: list[str] = []
    if inputs.cluster_stale:
        fallbacks.append("cluster view stale: holding serving scale-down, not growing training")
    new_history = dict(state.serving_history)
    new_seen = dict(state.serving_seen_since)
    new_grew = {target: t for target, t in state.job_grew_at.items() if target in managed_row}

    # Sparse view of the counts: entries (row, node, count), grouped by row.
    entry_row, entry_node, entry_count = entries.row, entries.node, entries.count
    bound_totals = entries.row_totals
    serving_count = len(inputs.serving)

    # -- 1. serving ---------------------------------------------------------------------------
    # Without a fresh view of the cluster or of some serving demand, training must not take
    # capacity serving might need: it keeps what it has but does not grow.
    growth_frozen = inputs.cluster_stale
    usage = fixed.copy()
    serving_desired: list[int] = []
    for row, workload in enumerate(inputs.serving):
        target = workload.target
        current = inputs.current.get(target, int(bound_totals[row]))
        seen_since = new_seen.setdefault(target, now)
        desired, reason, history, fallback = _plan_serving(
            workload,
            inputs.forecasts.get(target),
            current=current,
            history=state.serving_history.get(target, ()),
            seen_since=seen_since,
            now=now,
            config=config,
            cluster_stale=inputs.cluster_stale,
        )
        new_history[target] = history
        if fallback is not None:
            fallbacks.append(fallback)
            growth_frozen = True
        serving_desired.append(desired)
        decisions.append(TargetDecision(target, "serving", current, desired, reason))

    serving_requests = np.array(
        [w.replica_requests for w in inputs.serving], dtype=np.float64
    ).reshape(-1, 3)
    job_requests = np.array(
        [job.trainer_requests for job in inputs.jobs], dtype=np.float64
    ).reshape(-1, 3)
    is_serving = entry_row < serving_count
    serving_rows, serving_nodes = entry_row[is_serving], entry_node[is_serving]
    serving_stays = level_down_many(
        entry_count[is_serving],
        serving_rows,
        serving_count,
        np.asarray(serving_desired, dtype=np.int64),
    )
    usage += node_sums(serving_nodes, serving_stays, serving_requests[serving_rows], node_count)
    serving_stayed = np.bincount(serving_rows, weights=serving_stays, minlength=serving_count)
    job_rows = entry_row[~is_serving] - serving_count  # job index
    job_nodes = entry_node[~is_serving]
    job_entry_counts = entry_count[~is_serving]
    job_bound = bound_totals[serving_count:]
    trainer_usage = node_sums(job_nodes, job_entry_counts, job_requests[job_rows], node_count)
    free_of_all = allocatable - usage - trainer_usage  # what the scheduler finds free
    free_of_serving = allocatable - usage  # what serving can take by preempting trainers
    for row, workload in enumerate(inputs.serving):
        request = serving_requests[row]
        additions = serving_desired[row] - int(serving_stayed[row])
        if additions <= 0:
            continue
        # Free room first (what the scheduler does), then room trainers must give back.
        nodes, placed = pack_sparse(free_of_all, request, additions)
        taken = placed[:, None] * request
        usage[nodes] += taken
        free_of_all[nodes] -= taken
        free_of_serving[nodes] -= taken
        rest = additions - int(placed.sum())
        if rest > 0:
            nodes, placed = pack_sparse(free_of_serving, request, rest)
            taken = placed[:, None] * request
            usage[nodes] += taken
            free_of_all[nodes] -= taken
            free_of_serving[nodes] -= taken
            unplaced = rest - int(placed.sum())
            if unplaced > 0:
                infeasible.append(
                    Infeasible(
                        workload.target,
                        f"{unplaced} of {additions} new replicas fit on no node even with all "
                        "training removed",
                    )
                )

    # -- 2. training, tier by tier ------------------------------------------------------------
    free = allocatable - usage
    tiers = sorted({job.priority for job in inputs.jobs}, reverse=True)
    for tier in tiers:
        members = [k for k, job in enumerate(inputs.jobs) if job.priority == tier]
        # Running jobs first, then by submission: they keep their nodes and are admitted first.
        members.sort(
            key=lambda k: (
                int(job_bound[k]) < inputs.jobs[k].floor,
                inputs.jobs[k].submitted_at,
                inputs.jobs[k].target,
            )
        )
        member_array = np.asarray(members, dtype=np.int64)
        to_local = np.full(len(inputs.jobs), -1, dtype=np.int64)
        to_local[member_array] = np.arange(len(members))
        in_tier = to_local[job_rows] >= 0
        local_job = to_local[job_rows[in_tier]]
        by_job = np.argsort(local_job, kind="stable")
        local_job = local_job[by_job]
        local_node = job_nodes[in_tier][by_job]
        local_count = job_entry_counts[in_tier][by_job]
        local_request = job_requests[member_array].reshape(-1, 3)[local_job]
        # Trainers stay where they are unless serving or a higher tier took their node; there,
        # earlier jobs keep theirs first.
        kept = local_count.copy()
        tier_use = node_sums(local_node, local_count, local_request, node_count)
        overflow = np.any(free - tier_use < -1e-6, axis=1)
        if overflow.any():
            # Per overflowing node, in job order: an entry keeps what fits after the earlier
            # entries on that node (counted in full: conservative if one was clipped).
            on_overflow = np.flatnonzero(overflow[local_node])
            on_overflow = on_overflow[np.lexsort((local_job[on_overflow], local_node[on_overflow]))]
            nodes = local_node[on_overflow]
            requests = local_request[on_overflow]
            use = local_count[on_overflow][:, None] * requests
            running = np.cumsum(use, axis=0)
            first = np.r_[True, nodes[1:] != nodes[:-1]]
            group_start = np.maximum.accumulate(np.where(first, np.arange(len(nodes)), 0))
            before = running - use - (running[group_start] - use[group_start])
            room = free[nodes] - before
            with np.errstate(divide="ignore", invalid="ignore"):
                ratio = np.where(requests > 0, np.floor((room + 1e-6) / requests), np.inf)
            fits = np.clip(ratio.min(axis=1), 0, local_count[on_overflow]).astype(np.int64)
            kept[on_overflow] = fits
        tier_free = free - node_sums(local_node, kept, local_request, node_count)
        kept_totals = np.bincount(local_job, weights=kept, minlength=len(members)).astype(np.int64)
        tier_jobs: list[_TierJob] = []
        forced: dict[int, int] = {}
        for local, k in enumerate(members):
            job = inputs.jobs[k]
            request = job_requests[k]
            kept_total = int(kept_totals[local])
            bound_total = int(job_bound[k])
            if kept_total < bound_total:
                forced[local] = bound_total - kept_total
            dominant = float(max((request / np.maximum(total, _EPS)).max(), _EPS))
            current = inputs.current.get(job.target, bound_total)
            hi = job.max_trainers
            if growth_frozen:
                hi = min(hi, max(current, kept_total))
            tier_jobs.append(_TierJob(job, current, request, kept_total, dominant, job.floor, hi))
        present = kept > 0
        solver = _TierSolver(
            tier_jobs,
            tier_free,
            entry_job=local_job[present],
            entry_node=local_node[present],
            entry_kept=kept[present],
        )
        order = list(range(len(tier_jobs)))
        base, excluded = solver.admit(order)
        admitted = [i for i in order if i not in excluded]
        ideal = solver.fill(admitted, base)

        # Churn limits on voluntary shrinks; then refill around the held jobs.
        held: dict[int, str] = {}
        budget = config.max_trainer_removals_per_step
        shrinking = sorted(
            (i for i in admitted if ideal[i] < tier_jobs[i].kept_total),
            key=lambda i: ideal[i] - tier_jobs[i].kept_total,
        )
        tolerance_held: set[int] = set()
        for i in shrinking:
            item = tier_jobs[i]
            removal = item.kept_total - ideal[i]
            grew_at = new_grew.get(item.job.target)
            if grew_at is not None and now - grew_at < config.min_trainer_lifetime_s:
                held[i] = (
                    f"shrink to {ideal[i]} deferred: grew {now - grew_at:.0f} s ago "
                    f"(minimum trainer lifetime {config.min_trainer_lifetime_s:.0f} s)"
                )
                continue
            if removal <= max(1, config.shrink_tolerance * item.kept_total) and (
                ideal[i] >= item.lo
            ):
                held[i] = f"shrink by {removal} skipped (within tolerance, avoids flapping)"
                tolerance_held.add(i)
                continue
            allowed = min(removal, budget)
            budget -= allowed
            if allowed < removal:
                held[i] = (
                    f"removals capped at {config.max_trainer_removals_per_step} per step "
                    f"(fair share {ideal[i]})"
                )
                tier_jobs[i].lo = tier_jobs[i].hi = item.kept_total - allowed
        final = ideal
        if held:
            for i in held:
                if tier_jobs[i].lo != tier_jobs[i].hi:
                    tier_jobs[i].lo = tier_jobs[i].hi = min(
                        tier_jobs[i].kept_total, tier_jobs[i].hi
                    )
            base2, excluded2 = solver.admit(order)
            if len(excluded2) > len(excluded) and tolerance_held:
                # A tolerance hold would keep a gang out: release those holds.
                for i in tolerance_held:
                    tier_jobs[i].lo, tier_jobs[i].hi = (
                        tier_jobs[i].job.floor,
                        tier_jobs[i].job.max_trainers,
                    )
                    if growth_frozen:
                        tier_jobs[i].hi = min(
                            tier_jobs[i].hi, max(tier_jobs[i].current, tier_jobs[i].kept_total)
                        )
                    del held[i]
                base2, excluded2 = solver.admit(order)
            admitted2 = [i for i in order if i not in excluded2]
            final = solver.fill(admitted2, base2)
            excluded = excluded2

        # Small growth of a running job waits until it is worth a membership change: each
        # change costs the job a restart, and serving's jitter would otherwise make trainers
        # come and go every few minutes.
        for i, item in enumerate(tier_jobs):
            growth = final[i] - item.current
            if i in excluded or i in held or growth <= 0 or item.current < item.job.floor:
                continue
            if growth <= max(1, config.grow_tolerance * item.current):
                final[i] = item.current
                held[i] = f"growth by {growth} deferred (within tolerance, avoids flapping)"

        # Decisions and the tier's placement.
        for i, item in enumerate(tier_jobs):
            job = item.job
            desired = final[i]
            if i in excluded and job.max_trainers > 0:
                reason = (
                    f"gang minimum {job.floor} x {_format_vector(job.trainer_requests)} "
                    "does not fit the free capacity: 0 trainers (all or nothing)"
                )
                if growth_frozen:
                    reason += "; inputs stale, not growing"
                infeasible.append(Infeasible(job.target, reason))
                desired = 0
            elif i in held:
                reason = held[i]
            elif i in forced and desired <= item.kept_total:
                reason = (
                    f"{forced[i]} trainer(s) must leave nodes that serving or a higher tier "
                    f"needs; fair share {desired}"
                )
            else:
                share = desired * item.dominant / job.weight
                reason = (
                    f"tier {tier}: weighted dominant share {share:.3f} "
                    f"(weight {job.weight:g}) -> {desired} trainers in "
                    f"[{job.floor}, {job.max_trainers}]"
                )
                if desired >= job.max_trainers:
                    reason += " (at max)"
                if growth_frozen and desired >= item.hi:
                    reason += "; inputs stale, not growing"
            if desired > item.kept_total:
                new_grew[job.target] = now
            decisions.append(TargetDecision(job.target, "training", item.current, desired, reason))
            final[i] = desired
        _, free, unplaced_counts = solver.place(final)
        for i, unplaced in enumerate(unplaced_counts.tolist()):
            if unplaced > 0:
                infeasible.append(
                    Infeasible(
                        tier_jobs[i].job.target,
                        f"{unplaced} trainer(s) fit on no node yet (per-node packing)",
                    )
                )

    node_usage = allocatable - free
    decision = Decision(tuple(decisions), tuple(infeasible), tuple(fallbacks), node_usage)
    new_state = PlanState(
        serving_history={k: v for k, v in new_history.items() if k in managed_row},
        serving_seen_since={k: v for k, v in new_seen.items() if k in managed_row},
        job_grew_at=new_grew,
    )
    return decision, new_state


def _format_vector(vector: Vector) -> str:
    cpu, memory, gpu = vector
    text = f"{cpu:g} cpu, {memory / 2**30:g} GiB"
    return text + (f", {gpu:g} gpu" if gpu else "")
