"""The planner's vocabulary: targets, the columnar cluster view, workloads, forecasts, the
policy's tunables, its inputs, state and decision. Pure data; imports numpy and the
contract's workload identity and workload specs only. A serving workload's and a training
job's fields and defaults are the contract's specs' (`ServingPolicy`, `TrainingPolicy`):
`ServingWorkload.of` and `TrainingJob.of` build them from a spec."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
import numpy.typing as npt

from tideshift.events.models import (
    DEFAULT_RESTART_COST_S,
    DEFAULT_SPEEDUP_EXPONENT,
    ServingPolicy,
    TrainingPolicy,
    WorkloadRef,
    spec_default,
)
from tideshift.services.cluster.core.overcommit import OvercommitConfig
from tideshift.services.core.constants import DAY_S

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]
BoolArray = npt.NDArray[np.bool_]

# (cpu cores, memory bytes, nvidia.com/gpu)
Vector = tuple[float, float, float]
RESOURCE_NAMES = ("cpu", "memory", "gpu")
# The forecast quantile a serving workload is sized for unless it says otherwise.
DEFAULT_SERVING_QUANTILE: float = spec_default(ServingPolicy, "quantile")
# A training job's work model unless it says otherwise: the contract's DEFAULT_SPEEDUP_EXPONENT
# and DEFAULT_RESTART_COST_S (events/models.py), imported above.


def _serving(name: str) -> Any:
    return spec_default(ServingPolicy, name)


# The contract's one workload identity (group-qualified kind, namespace, name), by the name
# the policy has always used for it.
Target = WorkloadRef


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
    # Each field as the spec's of the same meaning (ServingPolicy, seconds and requests/s).
    capacity_rps: float  # requests/s one replica serves at the target utilisation
    min_replicas: int = _serving("min_replicas")
    max_replicas: int = _serving("max_replicas")
    lead_time_s: float = _serving("lead_time_seconds")  # pod start-up until ready
    margin_s: float = _serving("margin_seconds")  # extra look-ahead beyond the lead time
    # scale-down waits for the window's highest recommendation
    stabilization_s: float = _serving("stabilization_seconds")
    quantile: float = DEFAULT_SERVING_QUANTILE  # which forecast quantile lending reads
    # core-hours of training one replica's worth of demand unserved for a minute is worth:
    # the level serving is sized at (serving/price.py)
    shortfall_price: float = _serving("shortfall_price")
    # Fraction of its request a replica uses while serving `capacity_rps` (the usage model of
    # overcommit: usage = demand / (replicas x capacity_rps) x this x request); 1 assumes the
    # whole request is used at capacity, lending nothing of a busy replica.
    target_utilization: float = _serving("target_utilization")

    @classmethod
    def of(
        cls,
        target: Target,
        replica_requests: Vector,
        spec: ServingPolicy,
        *,
        min_replicas: int | None = None,
        max_replicas: int | None = None,
    ) -> ServingWorkload:
        """The workload a spec describes; bounds narrowed by the caller (its own) if given."""
        return cls(
            target=target,
            replica_requests=replica_requests,
            capacity_rps=spec.capacity_rps,
            min_replicas=spec.min_replicas if min_replicas is None else min_replicas,
            max_replicas=spec.max_replicas if max_replicas is None else max_replicas,
            lead_time_s=spec.lead_time_seconds,
            margin_s=spec.margin_seconds,
            stabilization_s=spec.stabilization_seconds,
            quantile=spec.quantile,
            shortfall_price=spec.shortfall_price,
            target_utilization=spec.target_utilization,
        )


@dataclass(frozen=True, slots=True)
class Forecast:
    """Demand in requests/s; quantile q's value at times[i] holds until times[i + 1]."""

    issued_at: float
    times: tuple[float, ...]
    quantiles: Mapping[float, tuple[float, ...]]
    # Why the predictor no longer trusts this workload's forecasts (its recent coverage is
    # too low): serving is then sized on observed demand. Empty while trusted.
    untrusted: str = ""


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
    # Opted into batch capacity: its trainers request tideshift.io/batch-cpu / batch-memory
    # (what serving reserves but does not use), not cpu / memory, and are shrunk first when
    # serving's usage rises. Such pods appear in the cluster view with zero requests.
    batch: bool = False
    # The job's work model (as the simulator's WorkModel): what a change of its trainers buys
    # (throughput grows as trainers ** speedup_exponent) and costs (restart_cost_s seconds
    # without progress while the job checkpoints and re-forms), training/tier.py.
    speedup_exponent: float = DEFAULT_SPEEDUP_EXPONENT
    restart_cost_s: float = DEFAULT_RESTART_COST_S
    # What a finite job still has to do, in seconds at one trainer (at n trainers it takes
    # this / n ** speedup_exponent), from its progress (training/remaining.py); None: unknown or
    # a long-running job. Room beyond the gangs goes to finite jobs shortest-remaining-first.
    remaining_work: float | None = None

    def __post_init__(self) -> None:
        if self.remaining_work is not None and not self.remaining_work >= 0:
            raise ValueError(
                f"{self.target.name}: remaining_work: expected seconds >= 0 or None "
                f"(got {self.remaining_work!r})"
            )
        if self.batch and self.trainer_requests[2] > 0:
            raise ValueError(
                f"{self.target.name}: batch: GPUs are not lent, a batch job's trainers must "
                f"request 0 gpu (got {self.trainer_requests[2]:g})"
            )

    @classmethod
    def of(
        cls,
        target: Target,
        trainer_requests: Vector,
        spec: TrainingPolicy,
        *,
        min_trainers: int,
        max_trainers: int,
        submitted_at: float = 0.0,
    ) -> TrainingJob:
        """The job a spec describes, within the bounds the caller settled (spec and job's)."""
        restart, exponent = spec.work_model
        return cls(
            target=target,
            trainer_requests=trainer_requests,
            min_trainers=min_trainers,
            max_trainers=max_trainers,
            gang_min=spec.gang_min,
            priority=spec.priority,
            weight=spec.weight,
            submitted_at=submitted_at,
            batch=spec.batch,
            speedup_exponent=exponent,
            restart_cost_s=restart,
        )

    @property
    def nominal(self) -> int:
        return self.nominal_trainers if self.nominal_trainers is not None else self.max_trainers

    @property
    def floor(self) -> int:
        """The smallest useful trainer count."""
        return max(self.min_trainers, self.gang_min or 0, 1)


def tunable(default: float, meaning: str, **bounds: float) -> Any:
    """A `PolicyConfig` field with its meaning (and unit) and its bounds: the planner's settings
    (services/planner/settings.py) expose each as they are, under the same name."""
    return field(default=default, metadata={"meaning": meaning, "bounds": bounds})


@dataclass(frozen=True, slots=True)
class PolicyConfig:
    max_forecast_age_s: float = tunable(
        600.0, "older forecasts are stale: hold that workload, seconds", gt=0
    )
    max_trainer_removals_per_step: int = tunable(
        64, "at most this many voluntary (rebalancing) trainer removals per plan, all jobs", ge=1
    )
    min_trainer_lifetime_s: float = tunable(
        60.0, "no voluntary shrink sooner than this after a job grew, seconds (checkpoint)", ge=0
    )
    shrink_tolerance: float = tunable(
        0.05, "voluntary shrinks of at most this fraction are skipped (avoids flapping)", ge=0, lt=1
    )
    grow_tolerance: float = tunable(
        0.05,
        "growth of a running job by at most this fraction (and by less than this share of the "
        "cluster) waits (limits trainer churn)",
        ge=0,
        lt=1,
    )
    # Each trainer moved restarts both jobs, and room serving later releases goes to the job
    # furthest below its share first, so the shares converge without moves.
    rebalance_floor: float = tunable(
        0.5,
        "move trainers between running jobs only until every job has this fraction of its "
        "weighted fair share (1: rebalance to the fair share at once)",
        gt=0,
        le=1,
    )
    # Serving's safety net: demand above what the forecast allowed scales up at once and
    # holds scale-down through the panic window.
    panic_window_s: float = tunable(
        60.0, "demand above what the forecast allowed holds scale-down this long, seconds", ge=0
    )
    miss_tolerance: float = tunable(
        0.05,
        "a miss (which starts the panic window) counts only beyond this fraction above what "
        "the forecast allowed",
        ge=0,
    )
    # Serving must cover the first lead time of a rise, which no reaction can (replicas take
    # their start-up delay): the rise is priced from the workload's own recent rises
    # (serving/headroom.py), over a window long enough to hold a daily cycle's steepest ramp,
    # at the workload's priced level (serving/price.py); the large ones that recur on a
    # schedule within it are held only when the next is due.
    rise_window_s: float = tunable(
        DAY_S,
        "serving's headroom is the workload's quantile of its rises within one lead time "
        "observed over this long, seconds",
        gt=0,
    )
    # Room serving releases moves trainers in and, when demand returns, out again (a restart
    # each way): an expected cost, so weighed on the forecast's median.
    release_horizon_s: float = tunable(
        900.0,
        "serving scales down only to what the forecast's median needs over this long, seconds",
        ge=0,
    )
    # Batch capacity: per node, allocatable x (1 - margin) minus what non-batch pods use.
    overcommit: OvercommitConfig = field(default_factory=OvercommitConfig)
    # Serving's usage moves every minute, and lending each rise made batch trainers come and go
    # with it (on day-night-nasa-batch, 300 s churned about twice the run without the batch
    # job, 900 s lent almost nothing).
    batch_grow_after_s: float = tunable(
        600.0,
        "batch trainers grow only into room that stayed reclaimable this long and that the "
        "forecast keeps as long (they shrink at once), seconds",
        ge=0,
    )


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
    # Per finite job held back by admission (training/admission.py): since when it waits.
    job_queued_since: Mapping[Target, float] = field(default_factory=dict)
    serving_misses: Mapping[Target, Miss] = field(default_factory=dict)
    # Per node name: the batch room batch trainers may grow into (growth hysteresis).
    batch_room: Mapping[str, SteadyRoom] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class SteadyRoom:
    """One node's batch room (cpu, memory) for growth: `granted` drops with the room at once
    and rises only to `low`, the least room seen over a period of `batch_grow_after_s`
    starting at `since`."""

    granted: tuple[float, float]
    low: tuple[float, float]
    since: float


@dataclass(frozen=True, slots=True)
class Rises:
    """One serving workload's calibration window (serving/headroom.py): observations not yet
    a lead time old, the rises measured over each finished lead time, and the large ones."""

    pending: tuple[tuple[float, float], ...] = ()  # (time, observed req/s)
    scores: tuple[tuple[float, float], ...] = ()  # (time, highest within lead time / then)
    onsets: tuple[tuple[float, float], ...] = ()  # scores that may recur on a schedule


@dataclass(frozen=True, slots=True)
class Miss:
    """Whether observed serving demand just ran above what the forecast allowed (the panic
    window), and how far it rose within a lead time."""

    panic_until: float  # no scale-down before this
    observed: float | None = None  # the latest observation (req/s)
    rises: Rises = field(default_factory=Rises)


@dataclass(frozen=True, slots=True)
class HeadroomParts:
    """What sized one serving workload, each in requests/s (`simulate` shows them)."""

    forecast: float  # the forecast quantile's peak over the look-ahead window
    rise: float  # observed now x `rise_ratio`: where demand may be one lead time from now
    rise_ratio: float  # the calibrated rise within one lead time (>= 1)
    observed: float  # the reactive floor: demand observed now (0 when none)
    panic_hold: bool  # scale-down held: demand ran above what the forecast allowed
    # A rise that recurs with this period (seconds) is due and set `rise_ratio`; 0: none.
    recurring_period_s: float = 0.0
    # Otherwise, the quantile of its rises that set `rise_ratio` (the priced level,
    # serving/price.py).
    rise_quantile: float = 0.0
    forecast_level: float = 0.0  # the forecast quantile `forecast` was read at


Role = Literal["serving", "training"]


@dataclass(frozen=True, slots=True)
class TargetDecision:
    target: Target
    role: Role
    current: int
    desired: int
    reason: str
    headroom: HeadroomParts | None = None  # serving sized on a forecast: what sized it

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
