"""Which targets the planner manages, and which it leaves alone. Pure: no I/O, no clock.

Targets come from two places: the planner's settings (static) and the watcher's
`WorkloadChanged` events for workloads labelled `tideshift.io/role` (announced). A target in
both is planned by its static settings: static wins on conflict. An announced target is
forgotten when its removal arrives. Two kinds of target are set aside rather than planned:
a workload annotated `tideshift.io/paused: "true"`, and one an operator pinned with
`tideshift scale --for` (until the pin expires or is released). Their pods stay in the
cluster view as capacity no other target may use, and both are reported in the plan.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime

from tideshift.events import ScalePin, WorkloadChanged
from tideshift.services.planner.core import Role, ServingWorkload, Target, TrainingJob


@dataclass(frozen=True, slots=True)
class Held:
    """A target the plan leaves where it is (or where the operator pinned it), and why."""

    target: Target
    role: Role
    current: int
    desired: int
    reason: str


@dataclass(frozen=True, slots=True)
class Targets:
    serving: tuple[ServingWorkload, ...]
    jobs: tuple[TrainingJob, ...]
    held: tuple[Held, ...] = ()


def serving_of(event: WorkloadChanged) -> ServingWorkload:
    policy = event.serving
    assert policy is not None  # the contract requires it for role "serving"
    requests = event.requests
    low = max(policy.min_replicas, event.min_replicas)
    high = policy.max_replicas if event.max_replicas is None else event.max_replicas
    high = max(min(policy.max_replicas, high), low)
    return ServingWorkload.of(
        event.workload,
        (requests.cpu, requests.memory, float(requests.gpu)),
        policy,
        min_replicas=low,
        max_replicas=high,
    )


def job_of(event: WorkloadChanged, *, first_replicas: int, submitted_at: float) -> TrainingJob:
    """Bounds: the annotations within the job's own (gang minimum, elasticPolicy); without any
    maximum, the size it was submitted with. A batch job's requests are what it borrows."""
    policy = event.training
    assert policy is not None  # the contract requires it for role "training"
    requests = event.requests
    low = max(policy.min_replicas, event.min_replicas, 1)
    maxima = [m for m in (policy.max_replicas, event.max_replicas) if m is not None]
    high = max(min(maxima) if maxima else max(first_replicas, event.replicas), low)
    return TrainingJob.of(
        event.workload,
        (requests.cpu, requests.memory, float(requests.gpu)),
        policy,
        min_trainers=low,
        max_trainers=high,
        submitted_at=submitted_at,
    )


def pin_reason(pin: ScalePin) -> str:
    until = f"until {pin.until.isoformat()}" if pin.until is not None else "until released"
    return f"pinned at {pin.replicas} by the operator ({pin.reason}) {until}"


@dataclass
class TargetBook:
    """The static targets plus the announced ones, by identity."""

    static_serving: tuple[ServingWorkload, ...] = ()
    static_jobs: tuple[TrainingJob, ...] = ()
    # Announced workloads held at most; a newcomer past it is refused (counted in `refused`
    # until the service takes the count) until one is deleted. None: no bound.
    limit: int | None = None
    announced: dict[Target, WorkloadChanged] = field(default_factory=dict)
    _first_replicas: dict[Target, int] = field(default_factory=dict)
    _order: dict[Target, int] = field(default_factory=dict)
    _arrivals: int = 0
    refused: int = 0

    def apply(self, event: WorkloadChanged) -> bool:
        """Fold one announcement in (an older one than held loses); whether anything changed."""
        target = event.workload
        held = self.announced.get(target)
        if held is not None and held.observed_at > event.observed_at:
            return False
        if event.change == "deleted":
            self._first_replicas.pop(target, None)
            self._order.pop(target, None)
            return self.announced.pop(target, None) is not None
        if held is None and self.limit is not None and len(self.announced) >= self.limit:
            self.refused += 1
            return False
        self.announced[target] = event
        self._first_replicas.setdefault(target, event.replicas)
        if target not in self._order:
            self._arrivals += 1
            self._order[target] = self._arrivals
        return True

    def take_refused(self) -> int:
        """Announcements refused at the limit since the last call."""
        refused, self.refused = self.refused, 0
        return refused

    def static_targets(self) -> set[Target]:
        return {w.target for w in self.static_serving} | {j.target for j in self.static_jobs}

    def targets(self, pins: Mapping[Target, ScalePin], now: datetime) -> Targets:
        """What to plan now: pinned targets and paused workloads are held, not planned."""
        static = self.static_targets()
        live_pins = {
            target: pin for target, pin in pins.items() if pin.until is None or pin.until > now
        }
        held: list[Held] = []
        serving = [w for w in self.static_serving if w.target not in live_pins]
        jobs = [j for j in self.static_jobs if j.target not in live_pins]
        for target, event in sorted(self.announced.items()):
            if target in static:
                continue
            if event.paused:
                reason = "paused by its annotation tideshift.io/paused"
                held.append(Held(target, event.role, event.replicas, event.replicas, reason))
            elif event.held_by:  # another engine (Kueue) keeps its size
                held.append(Held(target, event.role, event.replicas, event.replicas, event.held_by))
            elif target in live_pins:
                continue
            elif event.role == "serving":
                serving.append(serving_of(event))
            else:
                order = len(self.static_jobs) + self._order[target]
                first = self._first_replicas[target]
                jobs.append(job_of(event, first_replicas=first, submitted_at=float(order)))
        held.extend(self._pinned(live_pins, static))
        return Targets(tuple(serving), tuple(jobs), tuple(held))

    def _pinned(self, pins: Mapping[Target, ScalePin], static: set[Target]) -> Iterable[Held]:
        static_roles: dict[Target, Role] = {w.target: "serving" for w in self.static_serving}
        static_roles.update({j.target: "training" for j in self.static_jobs})
        for target, pin in sorted(pins.items()):
            event = self.announced.get(target)
            if target in static:
                role = static_roles[target]
            elif event is not None and not event.paused:
                role = event.role
            else:
                continue  # not a target of ours (or paused, reported as such)
            current = event.replicas if event is not None else pin.replicas
            yield Held(target, role, current, pin.replicas, pin_reason(pin))
