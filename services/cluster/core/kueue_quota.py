"""Quota lent to Kueue by forecast: how much of the cluster a Kueue ClusterQueue may admit,
and which admitted workloads must go when that shrinks. Pure: numbers in, decisions out; time
is passed in.

What Tideshift writes, and why (docs/guides/kueue.md says it for users): the `nominalQuota` of
the labelled ClusterQueue's flavor. Kueue's other lever, a `lendingLimit` in a cohort, caps what
one ClusterQueue lends to the others of its cohort; it would need serving to be a ClusterQueue
whose quota is serving's capacity. Serving here is Deployments Kueue does not manage, so no
queue of serving's exists to lend from, and Kueue reclaims lent quota only when a workload of
the lender is pending, which a Deployment's pods never are. Writing the training queue's
nominal quota is the one lever that needs no change to how serving runs.

Kueue (v0.17, and its integration tests say so) does not evict admitted workloads when a
queue's nominal quota drops below their usage: they keep running over quota. So when the
quota shrinks under what is admitted, Tideshift takes the room back the way Kueue's own
preemption would choose: the lowest priority first, then the most recently admitted, by
deactivating their Workloads (`spec.active: false`, which Kueue turns into an eviction), and
reactivates them once the quota has room for them again (Kueue then re-admits by priority).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

# A ClusterQueue joins Tideshift with this label; its value names the ResourceFlavor whose
# quota Tideshift writes (each resource of RESOURCES that flavor covers).
LEND_QUOTA_LABEL = "tideshift.io/lend-quota"
# On a Workload Tideshift deactivated to give serving its room: reactivated when it fits.
DEACTIVATED_ANNOTATION = "tideshift.io/deactivated-for-serving"
RESOURCES = ("cpu", "memory", "nvidia.com/gpu")


@dataclass(frozen=True, slots=True)
class Amount:
    """cpu in cores, memory in bytes, gpu in devices."""

    cpu: float = 0.0
    memory: float = 0.0
    gpu: float = 0.0

    def __add__(self, other: Amount) -> Amount:
        return Amount(self.cpu + other.cpu, self.memory + other.memory, self.gpu + other.gpu)

    def __sub__(self, other: Amount) -> Amount:
        return Amount(self.cpu - other.cpu, self.memory - other.memory, self.gpu - other.gpu)

    def scaled(self, factor: float) -> Amount:
        return Amount(self.cpu * factor, self.memory * factor, self.gpu * factor)

    def at_least_zero(self) -> Amount:
        return Amount(max(self.cpu, 0.0), max(self.memory, 0.0), max(self.gpu, 0.0))

    def fits_in(self, other: Amount) -> bool:
        eps = 1e-9
        return (
            self.cpu <= other.cpu + eps
            and self.memory <= other.memory + eps
            and self.gpu <= other.gpu + eps
        )

    def by_name(self) -> dict[str, float]:
        return {"cpu": self.cpu, "memory": self.memory, "nvidia.com/gpu": self.gpu}


def amount_max(a: Amount, b: Amount) -> Amount:
    return Amount(max(a.cpu, b.cpu), max(a.memory, b.memory), max(a.gpu, b.gpu))


def amount_min(a: Amount, b: Amount) -> Amount:
    return Amount(min(a.cpu, b.cpu), min(a.memory, b.memory), min(a.gpu, b.gpu))


@dataclass(frozen=True, slots=True)
class QuotaConfig:
    # Growth of the quota at most once per this many seconds (a shrink for serving is never
    # held back: the forecast's lead time is what gives Kueue's evictions time to finish).
    min_interval_s: float = 300.0
    # Changes smaller than this fraction of the capacity are not written (no flapping).
    tolerance: float = 0.02


@dataclass(frozen=True, slots=True)
class QuotaInputs:
    capacity: Amount  # allocatable of the nodes the flavor stands for
    serving_lead: Amount  # serving's reservation over the lead time (the plan's sizes)
    # What serving must have within the lead time (its expected need, the median forecast;
    # at least what it runs now): admitted gang minimums give way to this, not to the
    # reservation's tail.
    serving_must: Amount
    other: Amount  # everything else not admitted by the queue (Tideshift's own training, system)
    admitted_minimum: Amount  # the gang minimums of the workloads the queue admitted


@dataclass(frozen=True, slots=True)
class QuotaDecision:
    quota: Amount  # what to write (the current quota when nothing is to change)
    changed: bool
    reason: str


def lendable(inputs: QuotaInputs) -> tuple[Amount, str]:
    """What serving will not need within the lead time, never below what admitted gang minimums
    need unless serving must have that room (its expected need over the lead time); and why."""
    spare = (inputs.capacity - inputs.other - inputs.serving_lead).at_least_zero()
    room = (inputs.capacity - inputs.other - inputs.serving_must).at_least_zero()
    floor = amount_min(inputs.admitted_minimum, room)
    quota = amount_max(spare, floor)
    if quota == spare:
        why = "what serving will not need within the lead time"
    else:
        why = "kept at the admitted gang minimums (serving's expected need leaves them room)"
    return quota, why


def next_quota(
    inputs: QuotaInputs,
    current: Amount | None,
    last_grown_at: float | None,
    now: float,
    config: QuotaConfig,
) -> QuotaDecision:
    """The quota to write now: `lendable`, with growth rate-limited and small changes left."""
    target, why = lendable(inputs)
    return decide(
        target,
        why,
        capacity=inputs.capacity,
        current=current,
        last_grown_at=last_grown_at,
        now=now,
        config=config,
    )


def decide(
    target: Amount,
    why: str,
    *,
    capacity: Amount,
    current: Amount | None,
    last_grown_at: float | None,
    now: float,
    config: QuotaConfig,
) -> QuotaDecision:
    """`target` (one queue's share of `lendable`) as written now: growth rate-limited, small
    changes (relative to `capacity`) left."""
    if current is None:
        return QuotaDecision(target, True, f"lent {_show(target)}: {why}")
    scale = capacity
    differs = any(
        abs(t - c) > config.tolerance * max(s, 1e-9)
        for t, c, s in zip(_fields(target), _fields(current), _fields(scale), strict=True)
    )
    if not differs:
        return QuotaDecision(current, False, f"kept {_show(current)}: within tolerance")
    grows = not target.fits_in(current)
    if grows and last_grown_at is not None and now - last_grown_at < config.min_interval_s:
        # Only the shrinking resources change now; growth waits for the interval.
        held = amount_min(target, current)
        if held == current:
            wait = config.min_interval_s - (now - last_grown_at)
            return QuotaDecision(current, False, f"kept {_show(current)}: growth in {wait:.0f}s")
        return QuotaDecision(held, True, f"shrunk to {_show(held)} for serving; growth waits")
    verb = "grown" if grows else "shrunk"
    return QuotaDecision(target, True, f"{verb} to {_show(target)}: {why}")


@dataclass(frozen=True, slots=True)
class Admitted:
    """One admitted (or Tideshift-deactivated) Workload of the queue."""

    name: str
    priority: int
    admitted_at: float  # when its quota was reserved (seconds)
    usage: Amount
    deactivated_by_us: bool = False


def to_deactivate(workloads: Sequence[Admitted], quota: Amount) -> list[str]:
    """The active workloads to evict so that the rest fit in `quota`: Kueue's own preemption
    order (the lowest priority first, then the most recently admitted), the fewest such."""
    active = [w for w in workloads if not w.deactivated_by_us]
    total = sum((w.usage for w in active), Amount())
    order = sorted(active, key=lambda w: (w.priority, -w.admitted_at, w.name))
    chosen: list[str] = []
    for workload in order:
        if total.fits_in(quota):
            break
        chosen.append(workload.name)
        total = total - workload.usage
    return chosen


def to_reactivate(workloads: Sequence[Admitted], quota: Amount) -> list[str]:
    """Workloads Tideshift deactivated that the quota has room for again, the highest priority
    and the earliest admitted first (Kueue then admits them itself)."""
    active = sum((w.usage for w in workloads if not w.deactivated_by_us), Amount())
    waiting = [w for w in workloads if w.deactivated_by_us]
    chosen: list[str] = []
    for workload in sorted(waiting, key=lambda w: (-w.priority, w.admitted_at, w.name)):
        if (active + workload.usage).fits_in(quota):
            chosen.append(workload.name)
            active = active + workload.usage
    return chosen


def share(total: Amount, queues: Sequence[str], weights: Mapping[str, float]) -> dict[str, Amount]:
    """`total` split between the labelled queues by weight (1 each unless given)."""
    if not queues:
        return {}
    raw = {name: max(weights.get(name, 1.0), 0.0) for name in queues}
    whole = sum(raw.values()) or float(len(queues))
    return {name: total.scaled((raw[name] or 0.0) / whole) for name in queues}


def quantity(resource: str, value: float) -> str:
    """A Kubernetes quantity Kueue accepts: cpu in millicores, memory in Mi, gpu whole."""
    if resource == "cpu":
        return f"{math.floor(max(value, 0.0) * 1000)}m"
    if resource == "memory":
        return f"{math.floor(max(value, 0.0) / 2**20)}Mi"
    return str(math.floor(max(value, 0.0)))


def _fields(amount: Amount) -> tuple[float, float, float]:
    return (amount.cpu, amount.memory, amount.gpu)


def _show(amount: Amount) -> str:
    text = f"cpu {amount.cpu:.2f}, memory {amount.memory / 2**30:.1f}Gi"
    return text + (f", gpu {amount.gpu:.0f}" if amount.gpu else "")
