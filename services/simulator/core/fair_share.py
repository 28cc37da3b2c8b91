"""No job left behind (issue 39, item 4): whether a job at zero trainers was owed some.

`simulate` counts the job-hours a job spent with no trainer bound while its fair share was
positive. The fair share is *modelled*, on the room training could have had, not on what the
policy left it:

* room: the cluster's allocatable minus what serving needs for the actual demand (the whole
  replicas at the target utilisation, the reachable minimum) minus the pods no policy scales;
* within each priority tier (highest first), a weighted dominant-resource-fair level raised
  until the room is used (progressive filling: a job that cannot take one more trainer is
  frozen at what it has, the others go on); a job reaches only the nodes one of its trainers
  fits on, so a GPU job's share is of the GPU nodes' room, whatever kind of node serving left
  free;
* the share is positive when it is at least the job's gang (its trainers that must start
  together): a share below it runs nothing, under any policy.

Aggregate per node kind, not packed per node, and parameter servers are left out: a bound
for an audit, not a plan. Pure numpy; no I/O."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

FloatArray = npt.NDArray[np.float64]

_ROOM_SLACK = 1e-9
_BISECTIONS = 40


@dataclass(frozen=True, slots=True)
class ShareJob:
    """One live job as the fair share sees it; vectors are (cpu, memory, gpu)."""

    request: tuple[float, float, float]  # one trainer
    gang: int  # trainers that must run together (at least 1)
    most: int  # max trainers
    weight: float = 1.0
    priority: int = 0


def fair_shares(jobs: Sequence[ShareJob], nodes: FloatArray, room: FloatArray) -> list[int]:
    """Each job's fair share of trainers: `nodes` the allocatable per schedulable node
    (nodes, 3), `room` what training could have in all (3,)."""
    total = nodes.sum(axis=0) if len(nodes) else np.zeros(3)
    requests = np.array([job.request for job in jobs], dtype=np.float64).reshape(-1, 3)
    # What each job can reach: the nodes one of its trainers fits on.
    reach = np.array(
        [
            nodes[np.all(nodes >= requests[i] - _ROOM_SLACK, axis=1)].sum(axis=0)
            for i in range(len(jobs))
        ],
        dtype=np.float64,
    ).reshape(-1, 3)
    shares = [0] * len(jobs)
    left = np.maximum(np.asarray(room, dtype=np.float64), 0.0)
    for tier in sorted({job.priority for job in jobs}, reverse=True):
        members = [i for i, job in enumerate(jobs) if job.priority == tier]
        counts = _fill(jobs, members, requests, reach=reach, total=total, room=left)
        for i in members:
            shares[i] = counts[i]
            left = left - counts[i] * requests[i]
    return shares


def positive(jobs: Sequence[ShareJob], shares: Sequence[int]) -> list[bool]:
    """Whether each job's fair share runs it (at least its gang)."""
    return [share >= max(job.gang, 1) for job, share in zip(jobs, shares, strict=True)]


def _fill(
    jobs: Sequence[ShareJob],
    members: Sequence[int],
    requests: FloatArray,
    *,
    reach: FloatArray,
    total: FloatArray,
    room: FloatArray,
) -> dict[int, int]:
    """Progressive filling of one tier: the highest common level (trainers x dominant share /
    weight) that fits, each job frozen once one more trainer of it no longer would."""
    dominant = {
        i: float(np.max(np.divide(requests[i], total, out=np.zeros(3), where=total > 0)))
        for i in members
    }
    counts = dict.fromkeys(members, 0)
    active = [i for i in members if dominant[i] > 0 and jobs[i].most > 0]

    def at(level: float, i: int) -> int:
        return min(jobs[i].most, int(level * jobs[i].weight / dominant[i] + 1e-9))

    def fits(candidate: dict[int, int]) -> bool:
        used = sum((candidate[i] * requests[i] for i in members), np.zeros(3))
        if np.any(used > room + _ROOM_SLACK):
            return False
        return all(
            np.all(candidate[i] * requests[i] <= np.minimum(room, reach[i]) + _ROOM_SLACK)
            for i in members
        )

    while active:
        top = max(jobs[i].most * dominant[i] / jobs[i].weight for i in active)
        low, high = 0.0, top
        if fits(counts | {i: at(top, i) for i in active}):
            low = top
        else:
            for _ in range(_BISECTIONS):
                middle = (low + high) / 2
                if fits(counts | {i: at(middle, i) for i in active}):
                    low = middle
                else:
                    high = middle
        counts |= {i: max(counts[i], at(low, i)) for i in active}
        # Freeze the jobs at their most and those one more trainer of which does not fit.
        frozen = [
            i for i in active if counts[i] >= jobs[i].most or not fits(counts | {i: counts[i] + 1})
        ]
        if not frozen:  # numerically stuck: nothing moves any more
            break
        active = [i for i in active if i not in frozen]
    return counts
