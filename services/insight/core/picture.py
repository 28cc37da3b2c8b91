"""The current picture `tideshift status` prints: planners (leader, degraded reasons), each
serving workload (demand, forecast, ready/desired replicas, why), each training job
(trainers, what holds it), what each node lends to batch trainers. Pure: built from the latest
plan, planner statuses and scale results the history stream kept and the watcher's snapshot;
`now` only ages them.

The leader is the holder of the planner's lease (the leases bucket), which is current; each
planner's mode and degraded reasons are its last announcement the history kept (a planner
announces only changes, so one that started before the history existed has none).

A target's role is the watcher's (its `tideshift.io/role` label); one the plan names but the
snapshot does not (listed in the planner's settings) counts as serving when the plan sized it
on a forecast, else as a training job. A node lends what the batch trainers on it borrow: each
such pod holds its job's per-replica request (`tideshift.io/batch-cpu` and batch-memory).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from datetime import datetime
from typing import Any

from tideshift.events.models import (
    NodeChanged,
    PlanDecided,
    PlannerStatus,
    PodChanged,
    ScaleResult,
    TargetDecision,
    WorkloadChanged,
    WorkloadRef,
)

GIB = 2.0**30


@dataclass(frozen=True)
class Planner:
    name: str
    leader: bool
    mode: str  # "unknown": no announcement kept
    reasons: tuple[str, ...]
    age_s: float | None  # since its last announcement


@dataclass(frozen=True)
class Lease:
    """The planner's lease as the leases bucket holds it."""

    holder: str
    expires_at: datetime


@dataclass(frozen=True)
class Target:
    """A serving workload or a training job: the cluster's count, the plan's, and why."""

    target: str
    replicas: int | None  # desired in its spec (the snapshot's)
    ready: int | None
    planned: int | None  # the latest plan's
    demand_rps: float | None
    forecast_rps: float | None
    batch: bool
    executor: str  # the latest result for it, e.g. "applied 5 -> 8" or "would_scale 5 -> 8"
    why: str


@dataclass(frozen=True)
class NodeLending:
    name: str
    ready: bool
    cpu: float
    memory_gib: float
    batch_pods: int
    lent_cpu: float
    lent_memory_gib: float


@dataclass(frozen=True)
class Picture:
    at: datetime
    plan_id: str | None
    plan_age_s: float | None
    planners: tuple[Planner, ...]
    serving: tuple[Target, ...]
    jobs: tuple[Target, ...]
    nodes: tuple[NodeLending, ...]
    infeasible: tuple[str, ...] = field(default=())

    def as_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["at"] = self.at.isoformat()
        return data


@dataclass(frozen=True)
class Kept:
    """What the history and the snapshot hold now."""

    plan: PlanDecided | None
    lease: Lease | None
    statuses: Sequence[PlannerStatus]
    results: Mapping[WorkloadRef, ScaleResult]
    workloads: Sequence[WorkloadChanged]
    nodes: Sequence[NodeChanged]
    pods: Sequence[PodChanged]


def picture(kept: Kept, now: datetime) -> Picture:
    decided = {item.target: item for item in kept.plan.targets} if kept.plan else {}
    known = {w.workload: w for w in kept.workloads if w.change != "deleted"}
    serving: list[Target] = []
    jobs: list[Target] = []
    for ref in sorted(set(known) | set(decided)):
        workload, item = known.get(ref), decided.get(ref)
        row = _target(ref, workload, item, kept.results.get(ref))
        role = workload.role if workload else ("serving" if item and item.headroom else "training")
        (serving if role == "serving" else jobs).append(row)
    plan = kept.plan
    return Picture(
        at=now,
        plan_id=plan.plan_id if plan else None,
        plan_age_s=(now - plan.decided_at).total_seconds() if plan else None,
        planners=_planners(kept.statuses, kept.lease, now),
        serving=tuple(serving),
        jobs=tuple(jobs),
        nodes=tuple(_lending(kept.nodes, kept.pods, known.values())),
        infeasible=plan.infeasible if plan else (),
    )


def _planners(
    statuses: Sequence[PlannerStatus], lease: Lease | None, now: datetime
) -> tuple[Planner, ...]:
    holder = lease.holder if lease is not None and lease.expires_at > now else None
    rows = {
        s.planner: Planner(
            s.planner,
            s.planner == holder if lease is not None else s.leader,
            s.mode,
            s.reasons,
            (now - s.at).total_seconds(),
        )
        for s in statuses
    }
    if holder is not None and holder not in rows:
        rows[holder] = Planner(holder, True, "unknown", (), None)
    return tuple(rows[name] for name in sorted(rows))


def _target(
    ref: WorkloadRef,
    workload: WorkloadChanged | None,
    item: TargetDecision | None,
    result: ScaleResult | None,
) -> Target:
    headroom = item.headroom if item else None
    executed = ""
    if result is not None:
        executed = f"{result.outcome} {result.previous} -> {result.current}"
        executed = executed if result.previous is not None else result.outcome
    return Target(
        target=str(ref),
        replicas=workload.replicas if workload else None,
        ready=workload.ready_replicas if workload else None,
        planned=item.desired if item else None,
        demand_rps=headroom.observed if headroom else None,
        forecast_rps=headroom.forecast if headroom else None,
        batch=bool(workload and workload.training and workload.training.batch),
        executor=executed,
        why=item.reason if item else "not in the latest plan",
    )


def _lending(
    nodes: Iterable[NodeChanged], pods: Iterable[PodChanged], workloads: Iterable[WorkloadChanged]
) -> list[NodeLending]:
    borrowing = {
        w.workload: w.requests for w in workloads if w.training is not None and w.training.batch
    }
    lent: dict[str, list[float]] = {}
    for pod in pods:
        live = pod.change != "deleted" and pod.phase in ("Pending", "Running")
        if not live or pod.node is None or pod.owner not in borrowing:
            continue
        requests = borrowing[pod.owner]
        totals = lent.setdefault(pod.node, [0, 0.0, 0.0])
        totals[0] += 1
        totals[1] += requests.cpu
        totals[2] += requests.memory
    rows = []
    for node in sorted(nodes, key=lambda n: n.name):
        if node.change == "deleted":
            continue
        count, cpu, memory = lent.get(node.name, [0, 0.0, 0.0])
        rows.append(
            NodeLending(
                name=node.name,
                ready=node.ready and not node.unschedulable,
                cpu=node.allocatable.cpu,
                memory_gib=node.allocatable.memory / GIB,
                batch_pods=int(count),
                lent_cpu=cpu,
                lent_memory_gib=memory / GIB,
            )
        )
    return rows


def render(picture: Picture) -> str:
    lines = [f"tideshift status at {picture.at:%Y-%m-%d %H:%M:%S}Z"]
    if not any(p.leader for p in picture.planners):
        lines.append("no planner leads (is a planner running?)")
    for p in picture.planners:
        role = "leader" if p.leader else "standby"
        why = f": {'; '.join(p.reasons)}" if p.reasons else ""
        said = "no announcement kept" if p.age_s is None else f"announced {p.age_s:.0f}s ago"
        lines.append(f"planner {p.name}: {role}, {p.mode}{why} ({said})")
    if picture.plan_id is None:
        lines.append("latest plan: none kept")
    else:
        lines.append(f"latest plan: {picture.plan_id} ({picture.plan_age_s:.0f}s ago)")
    lines.append("serving (ready/replicas -> planned, demand and forecast in req/s):")
    lines += [_row(row, rates=True) for row in picture.serving] or ["  none"]
    lines.append("training jobs (ready/replicas trainers -> planned):")
    lines += [_row(row, rates=False) for row in picture.jobs] or ["  none"]
    lines.append("nodes (allocatable; lent to batch trainers):")
    lines += [
        f"  {n.name}: {n.cpu:g} cpu, {n.memory_gib:.1f} GiB{'' if n.ready else ' (not ready)'}; "
        f"lends {n.lent_cpu:g} cpu, {n.lent_memory_gib:.1f} GiB to {n.batch_pods} batch pods"
        for n in picture.nodes
    ] or ["  none"]
    lines += [f"infeasible: {text}" for text in picture.infeasible]
    return "\n".join(lines)


def _row(row: Target, *, rates: bool) -> str:
    count = f"{_n(row.ready)}/{_n(row.replicas)} -> {_n(row.planned)}"
    extra = ""
    if rates:
        extra = f", demand {_rate(row.demand_rps)}, forecast {_rate(row.forecast_rps)}"
    elif row.batch:
        extra = ", batch"
    executed = f"; executor: {row.executor}" if row.executor else ""
    return f"  {row.target}: {count}{extra}{executed}\n    why: {row.why}"


def _n(value: int | None) -> str:
    return "?" if value is None else str(value)


def _rate(value: float | None) -> str:
    return "?" if value is None else f"{value:.1f}"
