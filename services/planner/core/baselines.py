"""Baseline policies with the same `plan(inputs, state, now)` shape as Tideshift's, and the
registry of every policy by name. Pure: no clock, no I/O.

* `static`: a fixed partition. Serving runs at the replicas its peak needs (given, or each
  workload's `max_replicas`); each job asks for its nominal trainers, non-elastic, and waits
  in the scheduler's queue until its whole gang fits.
* `hpa`: Kubernetes' HorizontalPodAutoscaler on observed load: every 15 s,
  desired = ceil(current * observed / (current * capacity)) unless within 10 % of 1;
  scale-down to the highest recommendation of the last 300 s. Training as in `static`:
  nobody lends it serving's spare capacity, it only gets what is left.
* `edl`: PaddlePaddle EDL's autoscaler for training (serving as in `hpa`, since EDL left
  serving to Kubernetes): every 5 s, when requests exceed 97 % of capacity, one trainer less
  for the most fulfilled job; otherwise one more trainer at a time for the least fulfilled
  job while one fits on a node and requests stay within 97 %.
  fulfillment = (current - min) / (max - min). A new job starts at its minimum.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Generic, Protocol, TypeVar

import numpy as np

from tideshift.services.core.constants import EPS
from tideshift.services.planner.core import (
    Decision,
    PlanInputs,
    PlanState,
    ServingWorkload,
    Target,
    TargetDecision,
    cluster_usage,
    plan,
    slots_per_node,
)

StateT = TypeVar("StateT")


class Policy(Protocol, Generic[StateT]):
    @property
    def name(self) -> str: ...

    @property
    def elastic_training(self) -> bool:
        """False: jobs run at their nominal size as non-elastic gangs (the simulator schedules
        them all-or-nothing at that size)."""
        ...

    @property
    def cadence_s(self) -> float | None:
        """How often the policy wants to plan; None: the caller's interval."""
        ...

    def initial_state(self) -> StateT: ...

    def plan(self, inputs: PlanInputs, state: StateT, now: float) -> tuple[Decision, StateT]: ...


class TideshiftPolicy:
    name = "tideshift"
    elastic_training = True
    cadence_s = None

    def initial_state(self) -> PlanState:
        return PlanState()

    def plan(self, inputs: PlanInputs, state: PlanState, now: float) -> tuple[Decision, PlanState]:
        return plan(inputs, state, now)


def _empty_usage(inputs: PlanInputs) -> Any:
    return np.zeros((len(inputs.cluster.node_names), 3))


def _fixed_training(inputs: PlanInputs) -> list[TargetDecision]:
    decisions = []
    for job in inputs.jobs:
        current = inputs.current.get(job.target, 0)
        decisions.append(
            TargetDecision(
                job.target,
                "training",
                current,
                job.nominal,
                f"non-elastic: nominal {job.nominal} trainers, queued until the gang fits",
            )
        )
    return decisions


@dataclass(frozen=True)
class StaticPolicy:
    serving_replicas: Mapping[Target, int] = field(default_factory=dict)
    name: str = "static"
    elastic_training: bool = False
    cadence_s: float | None = 30.0

    def initial_state(self) -> None:
        return None

    def plan(self, inputs: PlanInputs, state: None, now: float) -> tuple[Decision, None]:
        decisions = []
        for workload in inputs.serving:
            replicas = self.serving_replicas.get(workload.target, workload.max_replicas)
            decisions.append(
                TargetDecision(
                    workload.target,
                    "serving",
                    inputs.current.get(workload.target, 0),
                    replicas,
                    f"static partition sized for peak: {replicas} replicas",
                )
            )
        decisions += _fixed_training(inputs)
        return Decision(tuple(decisions), (), (), _empty_usage(inputs)), None


@dataclass(frozen=True)
class HpaState:
    last_sync: float | None = None
    desired: Mapping[Target, int] = field(default_factory=dict)
    history: Mapping[Target, tuple[tuple[float, int], ...]] = field(default_factory=dict)


def _hpa_serving(
    inputs: PlanInputs, state: HpaState, now: float, *, sync_s: float
) -> tuple[list[TargetDecision], HpaState]:
    due = state.last_sync is None or now - state.last_sync >= sync_s - EPS
    decisions = []
    desired_map = dict(state.desired)
    history_map = dict(state.history)
    for workload in inputs.serving:
        target = workload.target
        current = inputs.current.get(target, workload.min_replicas)
        if not due and target in desired_map:
            decisions.append(
                TargetDecision(
                    target, "serving", current, desired_map[target], "hpa: between syncs"
                )
            )
            continue
        desired, reason, history = _hpa_one(
            workload,
            current=current,
            observed=inputs.observed_rps.get(target),
            history=history_map.get(target, ()),
            now=now,
        )
        desired_map[target] = desired
        history_map[target] = history
        decisions.append(TargetDecision(target, "serving", current, desired, reason))
    new_state = HpaState(now if due else state.last_sync, desired_map, history_map)
    return decisions, new_state


HPA_TOLERANCE = 0.1
HPA_DOWN_STABILIZATION_S = 300.0


def _hpa_one(
    workload: ServingWorkload,
    *,
    current: int,
    observed: float | None,
    history: tuple[tuple[float, int], ...],
    now: float,
) -> tuple[int, str, tuple[tuple[float, int], ...]]:
    if observed is None or current <= 0:
        held = max(current, workload.min_replicas)
        return held, "hpa: no metric, holding", history
    ratio = observed / (current * workload.capacity_rps)
    if abs(ratio - 1.0) <= HPA_TOLERANCE:
        recommended = current
        reason = f"hpa: usage ratio {ratio:.2f} within tolerance"
    else:
        recommended = math.ceil(current * ratio - EPS)
        reason = f"hpa: usage ratio {ratio:.2f} -> {recommended}"
    recommended = min(max(recommended, workload.min_replicas), workload.max_replicas)
    cutoff = now - HPA_DOWN_STABILIZATION_S
    history = (*(item for item in history if item[0] > cutoff), (now, recommended))
    desired = min(current, max(value for _, value in history))
    desired = max(desired, recommended)
    return desired, reason, history


@dataclass(frozen=True)
class HpaPolicy:
    sync_s: float = 15.0
    name: str = "hpa"
    elastic_training: bool = False
    cadence_s: float | None = 15.0

    def initial_state(self) -> HpaState:
        return HpaState()

    def plan(self, inputs: PlanInputs, state: HpaState, now: float) -> tuple[Decision, HpaState]:
        decisions, new_state = _hpa_serving(inputs, state, now, sync_s=self.sync_s)
        decisions += _fixed_training(inputs)
        return Decision(tuple(decisions), (), (), _empty_usage(inputs)), new_state


@dataclass(frozen=True)
class EdlState:
    hpa: HpaState = field(default_factory=HpaState)
    last_tick: float | None = None
    trainers: Mapping[Target, int] = field(default_factory=dict)


EDL_MAX_LOAD = 0.97


@dataclass(frozen=True)
class EdlPolicy:
    tick_s: float = 5.0
    name: str = "edl"
    elastic_training: bool = True
    cadence_s: float | None = 5.0

    def initial_state(self) -> EdlState:
        return EdlState()

    def plan(self, inputs: PlanInputs, state: EdlState, now: float) -> tuple[Decision, EdlState]:
        serving_decisions, hpa_state = _hpa_serving(inputs, state.hpa, now, sync_s=15.0)
        trainers = {
            job.target: state.trainers.get(job.target, job.min_trainers) for job in inputs.jobs
        }
        reasons = {job.target: "edl: between ticks" for job in inputs.jobs}
        due = state.last_tick is None or now - state.last_tick >= self.tick_s - EPS
        if due and inputs.jobs:
            reasons = self._tick(inputs, serving_decisions, trainers)
        decisions = list(serving_decisions)
        for job in inputs.jobs:
            decisions.append(
                TargetDecision(
                    job.target,
                    "training",
                    inputs.current.get(job.target, 0),
                    trainers[job.target],
                    reasons[job.target],
                )
            )
        new_state = EdlState(hpa_state, now if due else state.last_tick, trainers)
        return Decision(tuple(decisions), (), (), _empty_usage(inputs)), new_state

    def _tick(
        self,
        inputs: PlanInputs,
        serving_decisions: list[TargetDecision],
        trainers: dict[Target, int],
    ) -> dict[Target, str]:
        fixed, counts = cluster_usage(inputs)
        serving_desired = {item.target: item.desired for item in serving_decisions}
        edl = _EdlView(inputs, trainers)
        requested = _edl_requested(inputs, fixed, serving_desired, trainers)
        reasons = {job.target: "edl: no change" for job in inputs.jobs}
        if edl.load(requested) > EDL_MAX_LOAD:
            candidates = [j.target for j in inputs.jobs if trainers[j.target] > j.min_trainers]
            if candidates:
                victim = max(candidates, key=lambda t: (edl.fulfillment(t), str(t)))
                trainers[victim] -= 1
                reasons[victim] = (
                    f"edl: requests {edl.load(requested):.1%} of capacity > 97%: most fulfilled, -1"
                )
            return reasons
        free = inputs.cluster.allocatable - _edl_used(inputs, fixed, counts, serving_desired)
        while (target := edl.grow_one(requested, free)) is not None:
            requested = requested + np.asarray(
                edl.job_by_target[target].trainer_requests, dtype=np.float64
            )
            reasons[target] = f"edl: least fulfilled ({edl.fulfillment(target):.2f} after), +1"
        return reasons


def _edl_requested(
    inputs: PlanInputs,
    fixed: np.ndarray[Any, Any],
    serving_desired: Mapping[Target, int],
    trainers: Mapping[Target, int],
) -> np.ndarray[Any, Any]:
    """Requests as EDL saw them: every pod asked for, bound or pending."""
    requested: np.ndarray[Any, Any] = fixed.sum(axis=0)
    for workload in inputs.serving:
        requested = requested + np.asarray(workload.replica_requests) * serving_desired.get(
            workload.target, 0
        )
    for job in inputs.jobs:
        requested = requested + np.asarray(job.trainer_requests) * trainers[job.target]
    return requested


def _edl_used(
    inputs: PlanInputs,
    fixed: np.ndarray[Any, Any],
    counts: np.ndarray[Any, Any],
    serving_desired: Mapping[Target, int],
) -> np.ndarray[Any, Any]:
    """Per-node use for EDL's room for one more trainer: what is bound now, serving at its new
    size."""
    used: np.ndarray[Any, Any] = fixed.copy()
    serving_rows = len(inputs.serving)
    for row, workload in enumerate(inputs.serving):
        replicas = max(int(counts[row].sum()), serving_desired.get(workload.target, 0))
        used += np.outer(counts[row], np.asarray(workload.replica_requests))
        extra = replicas - int(counts[row].sum())
        if extra > 0:  # unbound serving replicas will land somewhere: charge them evenly
            used += np.asarray(workload.replica_requests) * extra / max(len(used), 1)
    for offset, job in enumerate(inputs.jobs):
        used += np.outer(counts[serving_rows + offset], np.asarray(job.trainer_requests))
    return used


class _EdlView:
    """EDL's measures over the jobs' trainer counts (which `grow_one` raises)."""

    def __init__(self, inputs: PlanInputs, trainers: dict[Target, int]) -> None:
        self.jobs = inputs.jobs
        self.job_by_target = {job.target: job for job in inputs.jobs}
        self.trainers = trainers
        self.capacity = inputs.cluster.allocatable.sum(axis=0)

    def load(self, amount: np.ndarray[Any, Any]) -> float:
        capacity = self.capacity
        positive = capacity > 0
        return float((amount[positive] / capacity[positive]).max()) if positive.any() else 1.0

    def fulfillment(self, target: Target) -> float:
        job = self.job_by_target[target]
        span = max(job.max_trainers - job.min_trainers, 1)
        return (self.trainers[target] - job.min_trainers) / span

    def grow_one(
        self, requested: np.ndarray[Any, Any], free: np.ndarray[Any, Any]
    ) -> Target | None:
        """Add one trainer to the least fulfilled job that fits the load cap and some node;
        books it in `free` and `trainers`. None when no job can grow."""
        growable = [j.target for j in self.jobs if self.trainers[j.target] < j.max_trainers]
        growable.sort(key=lambda t: (self.fulfillment(t), str(t)))
        for target in growable:
            request = np.asarray(self.job_by_target[target].trainer_requests, dtype=np.float64)
            if self.load(requested + request) > EDL_MAX_LOAD:
                continue
            nodes = np.flatnonzero(slots_per_node(free, request) > 0)
            if len(nodes) == 0:
                continue
            free[nodes[0]] -= request
            self.trainers[target] += 1
            return target
        return None


PolicyFactory = Callable[[], Policy[Any]]

POLICIES: dict[str, PolicyFactory] = {
    "tideshift": TideshiftPolicy,
    "static": StaticPolicy,
    "hpa": HpaPolicy,
    "edl": EdlPolicy,
}


def make_policy(name: str, *, serving_peak: Mapping[Target, int] | None = None) -> Policy[Any]:
    """A fresh policy by registry name. `serving_peak` sizes the static partition."""
    if name not in POLICIES:
        raise KeyError(f"unknown policy {name!r}; expected one of {', '.join(POLICIES)}")
    if name == "static" and serving_peak is not None:
        return StaticPolicy(serving_replicas=dict(serving_peak))
    return POLICIES[name]()
