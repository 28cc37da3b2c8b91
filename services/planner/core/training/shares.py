"""Tier solving: within one priority tier, admit the jobs whose gangs fit (all or nothing,
earlier jobs first), then raise a weighted dominant-resource-fair level until the trainers no
longer pack per node, then top up single trainers; finite jobs (a known remaining work) then
share their room shortest-remaining-first. The plan uses `HoldingSolver`: a job that cannot take
one more trainer anywhere is held at what it got and the others filled again. Pure numpy; no
I/O."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from tideshift.services.cluster.core.placement import compact_down, entry_rest
from tideshift.services.core.constants import EPS
from tideshift.services.planner.core.model import (
    BoolArray,
    FloatArray,
    IntArray,
    TrainingJob,
)
from tideshift.services.planner.core.packing import (
    ROOM_SLACK,
    node_sums,
    pack_sparse,
    slots_per_node,
)

# (lo, hi) trainers per job of a tier: the range the solver may choose from.
Bounds = Sequence[tuple[int, int]]


@dataclass(frozen=True, slots=True)
class TierJob:
    job: TrainingJob
    current: int
    request: FloatArray
    kept_total: int  # trainers that stay where they are (after forced clipping)
    dominant: float  # dominant share of one trainer in the cluster


def _shape_order(jobs: Sequence[TierJob]) -> list[tuple[tuple[float, float, float], list[int]]]:
    shapes: dict[tuple[float, float, float], list[int]] = {}
    for index, item in enumerate(jobs):
        key = (float(item.request[0]), float(item.request[1]), float(item.request[2]))
        shapes.setdefault(key, []).append(index)
    # GPU shapes first (the scarcest, most fragmented resource), then bigger before smaller.
    return sorted(shapes.items(), key=lambda entry: (-entry[0][2], -entry[0][0], -entry[0][1]))


class TierSolver:
    """Feasibility and fair-share search for one priority tier."""

    def __init__(
        self,
        jobs: list[TierJob],
        base_free: FloatArray,
        *,
        allocatable: FloatArray,
        entry_job: IntArray,
        entry_node: IntArray,
        entry_kept: IntArray,
    ) -> None:
        """`base_free`: room left with every kept trainer in place; entries (sorted by job):
        the kept trainers per (job, node)."""
        self.jobs = jobs
        self.base_free = base_free
        self.allocatable = allocatable
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
        self._entry_rest: FloatArray | None = None  # computed when a job first shrinks

    def freed(self, counts: Sequence[int]) -> FloatArray:
        """Room once every job that shrinks has left the nodes it frees most (`compact_down`)."""
        wanted = np.asarray(counts, dtype=np.int64)
        if not np.any(wanted < self.kept_totals):
            return self.base_free.copy()
        stays = compact_down(self.entry_kept, self.entry_job, len(self.jobs), wanted, self._rest)
        released = self.entry_kept - stays
        moved = released > 0
        return self.base_free + node_sums(
            self.entry_node[moved],
            released[moved],
            self.entry_request[moved],
            self.base_free.shape[0],
        )

    def _rest(self, mask: BoolArray) -> FloatArray:
        """How full each kept entry's node stays without that job's trainers there."""
        if self._entry_rest is None:
            self._entry_rest = entry_rest(
                self.allocatable - self.base_free,
                self.allocatable,
                self.entry_node,
                self.entry_kept,
                self.entry_request,
            )
        return self._entry_rest[mask]

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
            nodes, placed = pack_sparse(free, request, wanted, self.allocatable)
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

    def admit(self, order: list[int], bounds: Bounds) -> tuple[list[int], set[int]]:
        """Counts at each admitted job's floor; jobs whose gang cannot be placed get 0."""
        counts = [0] * len(self.jobs)
        excluded: set[int] = set()
        for index in order:
            low_bound, high_bound = bounds[index]
            if high_bound <= 0 or high_bound < low_bound:
                excluded.add(index)
        candidates = [i for i in order if i not in excluded]
        for i in candidates:
            counts[i] = bounds[i][0]
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
                    trial[i] = bounds[i][0]
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
            counts[i] = bounds[i][0]
        return counts, excluded

    def fill(self, admitted: Sequence[int], base: Sequence[int], bounds: Bounds) -> list[int]:
        """Highest level L whose fair counts still pack, then single-trainer top-ups.

        Counts only change at breakpoints L = n * dominant / weight, so the search runs over
        those: first against the tier's aggregate room (cheap), then per node (binary search
        below the aggregate bound; usually the bound itself packs).
        """
        if not admitted:
            return list(base)
        levels = _FairLevels(self, admitted, base, bounds)
        best = self._fill_progressively(levels, admitted)
        if best is None:
            best = self._bisect_per_node(levels, admitted)
        counts = self._top_up(best, admitted, bounds)
        finite = [i for i in admitted if self.jobs[i].job.remaining_work is not None]
        if len(finite) < 2:
            return counts
        return self._top_up(self._shortest_first(counts, finite, bounds), admitted, bounds)

    def _shortest_first(self, fair: list[int], finite: list[int], bounds: Bounds) -> list[int]:
        """The finite jobs' room goes shortest-remaining-first (Tiresias, Lyra): each at its
        floor, then each in turn (GPU jobs, then the others, each the soonest done at its most
        trainers first) grown as far as it packs. Jobs of unknown length keep their fair
        counts: ordering them by age instead gave the oldest long-running job everything
        (docs/evaluation/notebook.md)."""
        counts = list(fair)
        for i in finite:
            counts[i] = bounds[i][0]

        def soonest_done(i: int) -> tuple[bool, float, float, int]:
            # GPU jobs first, as they pack (`_shape_order`): a short CPU job first would
            # take the GPU nodes' cores and strand their GPUs.
            # A job above its floor keeps its place unless another is sooner done by more
            # than the restart a swap costs it: jobs parked at their floors progress while a
            # grown one pauses to restart, and by remaining work alone they overtook it each
            # plan (on edl-training-only trainers went 52 -> 36 -> 23 -> 60, churn +130).
            job = self.jobs[i].job
            time = (job.remaining_work or 0.0) / max(bounds[i][1], 1) ** job.speedup_exponent
            if self.jobs[i].current > bounds[i][0]:
                time -= job.restart_cost_s
            return (job.trainer_requests[2] <= 0, time, job.submitted_at, i)

        order = sorted(finite, key=soonest_done)
        _, free, _ = self.place(counts)
        start = 0
        while start < len(order):
            # The longest run of the next jobs that packs at their maxima (one packing per
            # step of a bisection, not one per job: on a roomy cluster every job gets its
            # maximum), then the first job after it grown on its own.
            fits = self._fit_in_aggregate(order[start:], counts, free, bounds)
            run, counts, free = self._longest_run_at_max(
                order[start : start + fits], counts, free, bounds
            )
            start += run
            if start < len(order):
                i = order[start]
                counts[i], free = self._most_that_packs(counts, i, bounds[i], free)
                start += 1
        return counts

    def _longest_run_at_max(
        self, run: Sequence[int], counts: list[int], free: FloatArray, bounds: Bounds
    ) -> tuple[int, list[int], FloatArray]:
        """How many of `run`'s jobs, in order, pack at their maxima beside `counts`
        (bisection, the whole run first), with the counts and the room then left."""
        low, high, middle = 0, len(run) if len(run) > 1 else 0, len(run)
        while low < high:
            trial = list(counts)
            for i in run[:middle]:
                trial[i] = bounds[i][1]
            placed, left, _ = self.place(trial)
            if placed:
                low, counts, free = middle, trial, left
            else:
                high = middle - 1
            middle = (low + high + 1) // 2
        return low, counts, free

    def _fit_in_aggregate(
        self, order: Sequence[int], counts: list[int], free: FloatArray, bounds: Bounds
    ) -> int:
        """How many of `order`'s jobs, in order, fit at their maxima in `free` in aggregate."""
        requests = np.array([self.jobs[i].request for i in order], dtype=np.float64)
        more = np.array([max(bounds[i][1] - counts[i], 0) for i in order], dtype=np.float64)
        need = np.cumsum(more[:, None] * requests.reshape(-1, 3), axis=0)
        fits = np.all(need <= free.sum(axis=0) + ROOM_SLACK, axis=1)
        return len(order) if fits.all() else int(np.argmin(fits))

    def _most_that_packs(
        self, counts: list[int], i: int, bound: tuple[int, int], free: FloatArray
    ) -> tuple[int, FloatArray]:
        """Job `i`'s most trainers within `bound` that still pack beside `counts`, and the
        room then left (`free`: the room left with `counts`). Tried at what the aggregate room
        allows, then at what of that packed, then by bisection below."""
        low = counts[i]
        request = self.jobs[i].request
        if low >= bound[1] or not slots_per_node(free, request).any():
            return low, free
        asked = request > 0
        spare = (free.sum(axis=0)[asked] / request[asked]).min(initial=float(bound[1]))
        high = min(bound[1], low + int(np.floor(max(spare, 0.0) + EPS)))
        if high <= low:
            return low, free
        placed, left, unplaced = self.place([*counts[:i], high, *counts[i + 1 :]])
        if placed:
            return high, left
        # What did not pack is this job's (the others packed before): what did is likely to.
        guess = high - int(unplaced.sum())
        high -= 1
        if low < guess <= high:
            placed, left, _ = self.place([*counts[:i], guess, *counts[i + 1 :]])
            if placed:
                return guess, left
            high = guess - 1
        while low < high:
            middle = (low + high + 1) // 2
            placed, left, _ = self.place([*counts[:i], middle, *counts[i + 1 :]])
            if placed:
                low, free = middle, left
            else:
                high = middle - 1
        return low, free

    def _fill_progressively(self, levels: _FairLevels, admitted: Sequence[int]) -> list[int] | None:
        """Raise the level to the aggregate bound, then freeze every job whose additions did
        not pack (per node) at what did, and raise the others again. A job blocked by its shape
        (GPUs, fragmentation) then no longer holds back the rest."""
        for _ in range(8):
            candidate = levels.counts_at(levels.aggregate_level())
            placed_all, _, unplaced = self.place(candidate)
            if placed_all:
                return candidate
            if not levels.freeze(admitted, candidate, unplaced):
                return None
        return None

    def _bisect_per_node(self, levels: _FairLevels, admitted: Sequence[int]) -> list[int]:
        """Bisection per node, down from the last aggregate bound."""
        top, low = levels.aggregate_level(), 0.0
        top_total, low_total = levels.total(top), levels.total(low)
        for _ in range(60):
            if top_total - low_total <= max(1, len(admitted) // 2) or top - low <= EPS * top:
                break
            middle = (low + top) / 2
            middle_total = levels.total(middle)
            if self.feasible(levels.counts_at(middle)):
                low, low_total = middle, middle_total
            else:
                top, top_total = middle, middle_total
        return levels.counts_at(low)

    def _top_up(self, best: list[int], admitted: Sequence[int], bounds: Bounds) -> list[int]:
        """Integer rounding leaves room for single trainers: add them to the jobs with the
        lowest weighted share first, each checked against its own shape's free slots."""
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
            if best[i] >= bounds[i][1] or best[i] < item.kept_total:
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


# Rounds of holding the jobs that cannot take one more trainer and refilling the others.
_HOLD_ROUNDS = 3


class HoldingSolver(TierSolver):
    """The tier's solver, whose fill does not let a job that cannot take one more trainer
    anywhere (its GPUs are all taken, or no node has room for its shape) cap the others: the
    fair level is bounded by every resource in aggregate, so a GPU job short of GPUs held the
    CPU jobs at its level while their cores sat free (finite-jobs-gpu: medium gang jobs at
    their gang minimum for hours beside idle nodes). Such jobs are held at what they got and
    the others filled again."""

    def fill(self, admitted: Sequence[int], base: Sequence[int], bounds: Bounds) -> list[int]:
        counts = super().fill(admitted, base, bounds)
        held = list(bounds)
        for _ in range(_HOLD_ROUNDS):
            _, free, _ = self.place(counts)
            growing = [i for i in admitted if counts[i] < held[i][1]]
            stuck = [i for i in growing if not slots_per_node(free, self.jobs[i].request).any()]
            if not stuck or len(stuck) == len(growing):
                break
            for i in stuck:
                held[i] = (counts[i], counts[i])
            refilled = super().fill(admitted, base, held)
            if sum(refilled) <= sum(counts):
                break
            counts = refilled
        return counts


class _FairLevels:
    """The admitted jobs' fair counts as a function of the level L, within their bounds (one
    `fill`'s working state: `freeze` lowers a job's upper bound to what packed)."""

    def __init__(
        self, solver: TierSolver, admitted: Sequence[int], base: Sequence[int], bounds: Bounds
    ) -> None:
        jobs = solver.jobs
        self.rows = np.asarray(admitted, dtype=np.int64)
        self.lo = np.array([bounds[i][0] for i in admitted], dtype=np.float64)
        self.hi = np.array([bounds[i][1] for i in admitted], dtype=np.float64)
        self.slope = np.array(
            [jobs[i].job.weight / jobs[i].dominant for i in admitted], dtype=np.float64
        )
        self.requests = np.array([jobs[i].request for i in admitted], dtype=np.float64)
        self.base = np.asarray(base, dtype=np.int64)
        self.room = solver.base_free.sum(axis=0) + solver.kept_totals @ np.array(
            [item.request for item in jobs]
        ).reshape(-1, 3)
        others = np.ones(len(jobs), dtype=np.bool_)
        others[self.rows] = False
        self.fixed_use = sum(
            (self.base[i] * jobs[i].request for i in np.flatnonzero(others)),
            np.zeros(3),
        )

    def fair(self, level: float) -> IntArray:
        counts: IntArray = np.clip(np.floor(level * self.slope + EPS), self.lo, self.hi).astype(
            np.int64
        )
        return counts

    def total(self, level: float) -> int:
        return int(self.fair(level).sum())

    def counts_at(self, level: float) -> list[int]:
        counts = self.base.copy()
        counts[self.rows] = self.fair(level)
        return [int(c) for c in counts]

    def fits_aggregate(self, level: float) -> bool:
        need = self.fair(level) @ self.requests + self.fixed_use
        return bool(np.all(need <= self.room + ROOM_SLACK))

    def aggregate_level(self) -> float:
        """Highest L whose fair counts fit the tier's room in total (bisection)."""
        low, high = 0.0, float((self.hi / self.slope).max()) + EPS
        low_total, high_total = self.total(low), self.total(high)
        if self.fits_aggregate(high):
            return high
        for _ in range(80):
            # At a breakpoint the two ends keep differing by one trainer: close enough, the
            # top-ups decide that last trainer (several jobs may share a breakpoint: then the
            # width decides).
            if high_total - low_total <= 1 or high - low <= EPS * high:
                break
            middle = (low + high) / 2
            middle_total = self.total(middle)
            if self.fits_aggregate(middle):
                low, low_total = middle, middle_total
            else:
                high, high_total = middle, middle_total
        return low

    def freeze(self, admitted: Sequence[int], candidate: list[int], unplaced: IntArray) -> bool:
        """Cap each job that did not pack at what did; False when nothing could be capped."""
        frozen = False
        for position, i in enumerate(admitted):
            if unplaced[i] > 0:
                cap = max(self.lo[position], candidate[i] - int(unplaced[i]))
                if cap < self.hi[position]:
                    self.hi[position] = cap
                    frozen = True
        return frozen
