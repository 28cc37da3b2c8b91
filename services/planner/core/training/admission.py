"""Admission of finite CPU jobs: a job of known length that has not started waits while the
finite jobs ahead of it (shortest-remaining-first, as `shares.TierSolver` grows them) would
use the room at their maxima, when taking its gang floor and parameter servers from them
costs them far more throughput than it brings. Admitting every job at once made each bring
its parameter servers and gang floor into room the running jobs would have used at a better
speed-up: on a stream of identical jobs all then finished together, late
(docs/evaluation/notebook.md, q26h).

A job that has waited long is not held back for ever: once it has waited AGED_AFTER times its
own time at its most trainers (Tiresias' starvation guard promotes a job after a multiple of
its service time), it starts at its gang floor as soon as room no trainer holds fits its floor
and parameter servers, so no running trainer stops for it (the room jobs ahead would have
grown into is what it costs them).

Only CPU jobs wait: GPU jobs are the scarce room's and never queue behind CPU jobs; jobs of
unknown length (long-running ones) are never held back. Pure numpy; no I/O."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

import numpy as np

from tideshift.services.planner.core.model import (
    BoolArray,
    FloatArray,
    PlanInputs,
    Target,
    TargetDecision,
    TrainingJob,
)
from tideshift.services.planner.core.packing import ROOM_SLACK, ClusterEntries, cluster_entries

# A newcomer waits only when the jobs ahead lose more than this many times the throughput it
# brings: at 1 (throughput alone) edl-training-only's jobs queued 468 s for a 1,125 s mean
# JCT, and a contended stream lost 0.5 % of its work with medium jobs queued 569 s; from 4.5
# to 6 the JCT is 1,145 s at 413 s queueing with no work lost, and beyond 10 the queueing
# falls and the work goes (the curve: docs/evaluation/notebook.md, q26h).
_LOSS_PER_GAIN = 5.0
# A waiting job starts in idle room once it has waited this many times its time at its most
# trainers. On edl-training-only (each job 600 s at 60 trainers, arriving 0-190 s) queueing
# falls from 413 s (never) to 327 s at 0.9 (JCT 1,145 -> 1,160 s, churn 1,240 unchanged);
# at 0.8 and below the jobs that wait 480-540 s start at the first wave's end (the curve:
# docs/evaluation/notebook.md, q26i).
AGED_AFTER = 0.9


@dataclass(frozen=True, slots=True)
class Admission:
    queued: tuple[TargetDecision, ...]  # the waiting jobs' decisions: 0 trainers, why
    since: dict[Target, float]  # since when each waits (carried in the plan's state)
    aged: dict[Target, float]  # jobs let in by their wait alone: how long they waited

    def note(self, decisions: Sequence[TargetDecision]) -> tuple[TargetDecision, ...]:
        """`decisions` with the reason of each job let in by its wait saying so."""
        return tuple(
            replace(item, reason=item.reason + _started_after_wait(self.aged[item.target]))
            if item.target in self.aged
            else item
            for item in decisions
        )


def queue_finite_jobs(
    inputs: PlanInputs,
    usage: FloatArray,
    entries: ClusterEntries,
    queued_since: Mapping[Target, float],
    now: float,
) -> tuple[PlanInputs, ClusterEntries, Admission]:
    """`inputs` and `entries` without the finite jobs that wait, and what admission decided
    (`queued_since`: the last plan's `Admission.since`). `usage`: per node, the requests of
    every pod the plan does not scale and of serving as planned. Out of the inputs, a waiting
    job's parameter servers hold no room (`reserve_pending_companions`)."""
    waiting, aged = _hold_back(inputs, usage, entries, queued_since, now)
    since = {target: queued_since.get(target, now) for target in waiting}
    if not waiting:
        return inputs, entries, Admission((), since, aged)
    decisions = tuple(
        TargetDecision(job.target, "training", inputs.current.get(job.target, 0), 0, why)
        for job in inputs.jobs
        if (why := waiting.get(job.target)) is not None
    )
    kept = replace(inputs, jobs=tuple(job for job in inputs.jobs if job.target not in waiting))
    return kept, cluster_entries(kept), Admission(decisions, since, aged)


def _hold_back(
    inputs: PlanInputs,
    usage: FloatArray,
    entries: ClusterEntries,
    queued_since: Mapping[Target, float],
    now: float,
) -> tuple[dict[Target, str], dict[Target, float]]:
    """The finite CPU jobs that wait, with why, and those let in by their wait alone, with how
    long they waited (`queue_finite_jobs`)."""
    jobs = inputs.jobs
    finite = [
        k
        for k, job in enumerate(jobs)
        if job.remaining_work is not None and job.trainer_requests[2] <= 0 and not job.batch
    ]
    cpu_nodes = inputs.cluster.allocatable[:, 2] <= 0
    if not finite or not cpu_nodes.any():
        return {}, {}
    started, pending = _started_and_pending(inputs)
    room = _cpu_room(inputs, usage, entries, cpu_nodes)
    idle = room - _finite_held(inputs, entries, cpu_nodes)  # what no trainer holds
    ahead: list[TrainingJob] = []  # the jobs before, each at its maximum
    used = np.zeros(3)
    # Started jobs cannot be queued again: those after a job keep at least their floors.
    behind = sum((_use(jobs[k], jobs[k].floor) for k in finite if started[k]), np.zeros(3))
    waiting: dict[Target, str] = {}
    aged_in: dict[Target, float] = {}
    for k in sorted(finite, key=lambda k: _soonest_done(jobs[k])):
        job = jobs[k]
        if started[k]:
            behind -= _use(job, job.floor)
        else:
            need = used + behind + _use(job, job.floor) + pending[k]
            asked = (np.asarray(job.trainer_requests) > 0) | (pending[k] > 0)
            over = np.where(asked, need - room, 0.0)
            gain = job.weight * job.floor**job.speedup_exponent
            floor = _use(job, job.floor) + pending[k]
            waited = now - queued_since.get(job.target, now)
            aged = waited >= AGED_AFTER * _time_at_max(job)
            fits_idle = bool(np.all(np.where(asked, floor - idle, 0.0) <= ROOM_SLACK))
            costly = _loss_to_cover(ahead, over) > _LOSS_PER_GAIN * gain
            if costly and not (aged and fits_idle):
                waiting[job.target] = _queued_behind_shorter(job, need, room, waited, AGED_AFTER)
                continue
            if costly:
                aged_in[job.target] = waited
            idle -= floor
            used += pending[k]
        ahead.append(job)
        used += _use(job, job.max_trainers)
    return waiting, aged_in


def _cpu_room(
    inputs: PlanInputs, usage: FloatArray, entries: ClusterEntries, cpu_nodes: BoolArray
) -> FloatArray:
    """What the nodes without GPUs leave to finite jobs: jobs of unknown length keep what
    they hold (their fair share is not this module's)."""
    room: FloatArray = inputs.cluster.allocatable[cpu_nodes].sum(axis=0) - usage[cpu_nodes].sum(
        axis=0
    )
    serving = len(inputs.serving)
    on_cpu = (entries.row >= serving) & cpu_nodes[entries.node]
    for k, count in zip(
        (entries.row[on_cpu] - serving).tolist(), entries.count[on_cpu].tolist(), strict=True
    ):
        if inputs.jobs[k].remaining_work is None:
            room -= _use(inputs.jobs[k], count)
    return room


def _finite_held(inputs: PlanInputs, entries: ClusterEntries, cpu_nodes: BoolArray) -> FloatArray:
    """What the finite jobs' trainers hold on the nodes without GPUs now."""
    serving = len(inputs.serving)
    on_cpu = (entries.row >= serving) & cpu_nodes[entries.node]
    held = np.zeros(3)
    for k, count in zip(
        (entries.row[on_cpu] - serving).tolist(), entries.count[on_cpu].tolist(), strict=True
    ):
        if inputs.jobs[k].remaining_work is not None:
            held += _use(inputs.jobs[k], count)
    return held


def _loss_to_cover(ahead: Sequence[TrainingJob], over: FloatArray) -> float:
    """The weighted throughput the jobs ahead lose when the longest of them shrink (down to
    their floors) until `over` (what a newcomer needs beyond the room) is free; infinite when
    they cannot free it. Throughput is trainers ** speedup_exponent, as in `shares`."""
    left = over.copy()
    loss = 0.0
    for job in reversed(ahead):
        if np.all(left <= ROOM_SLACK):
            break
        request = np.asarray(job.trainer_requests, dtype=np.float64)
        short = (left > ROOM_SLACK) & (request > 0)
        if not short.any():
            continue
        taken = min(job.max_trainers - job.floor, math.ceil((left[short] / request[short]).max()))
        if taken <= 0:
            continue
        exponent = job.speedup_exponent
        loss += job.weight * (job.max_trainers**exponent - (job.max_trainers - taken) ** exponent)
        left -= taken * request
    return loss if np.all(left <= ROOM_SLACK) else math.inf


def _use(job: TrainingJob, trainers: int) -> FloatArray:
    return trainers * np.asarray(job.trainer_requests, dtype=np.float64)


def _time_at_max(job: TrainingJob) -> float:
    return float((job.remaining_work or 0.0) / max(job.max_trainers, 1) ** job.speedup_exponent)


def _soonest_done(job: TrainingJob) -> tuple[int, float, float, str]:
    """Higher tiers first, then the job soonest done at its most trainers."""
    return (-job.priority, _time_at_max(job), job.submitted_at, job.target.name)


def _started_and_pending(inputs: PlanInputs) -> tuple[BoolArray, list[FloatArray]]:
    """Per job: whether any of its pods is bound (its gang has started), and the requests of
    its companions (parameter servers) waiting for a node."""
    view = inputs.cluster
    index = {owner: i for i, owner in enumerate(view.owners)}
    owned = view.pod_owner >= 0
    bound_owners = np.zeros(len(view.owners) + 1, dtype=np.bool_)
    bound_owners[view.pod_owner[owned & (view.pod_node >= 0)] + 1] = True
    waiting = owned & (view.pod_node < 0) & ~view.pod_replica
    pending_by_owner = np.zeros((len(view.owners) + 1, 3))
    np.add.at(pending_by_owner, view.pod_owner[waiting] + 1, view.pod_requests[waiting])
    rows = [index.get(job.target, -1) + 1 for job in inputs.jobs]
    started: BoolArray = np.array([row > 0 and bound_owners[row] for row in rows], dtype=np.bool_)
    pending = [pending_by_owner[row] if row > 0 else np.zeros(3) for row in rows]
    return started, pending


# ---- the words of admission's decisions -----------------------------------------------------


def _queued_behind_shorter(
    job: TrainingJob, need: FloatArray, room: FloatArray, waited: float, aged_after: float
) -> str:
    at_max = (job.remaining_work or 0.0) / max(job.max_trainers, 1) ** job.speedup_exponent
    return (
        f"queued: finite job (about {at_max:.0f} s at {job.max_trainers} trainers); the finite "
        f"jobs done sooner at their maxima, the started ones' floors and its own gang and "
        f"parameter servers need {need[0]:g} cpu, {need[1] / 2**30:g} GiB of the "
        f"{room[0]:g} cpu, {room[1] / 2**30:g} GiB the CPU nodes leave: 0 trainers; waited "
        f"{waited:.0f} s, starts at its floor in room no trainer holds after "
        f"{aged_after * at_max:.0f} s"
    )


def _started_after_wait(waited: float) -> str:
    return f"; let in at its floor, in room no trainer holds, after waiting {waited:.0f} s"
