"""The executor's side of quota lent to Kueue: each labelled ClusterQueue's nominal quota
written to its share of what serving will not need within the lead time
(cluster/core/kueue_quota.py decides), and the admitted workloads that no longer fit evicted in
Kueue's own order, then let back in when there is room.

Blocking (KubeHttp); the executor calls `step` in a thread. Bad input (Kueue missing or of
another version, a ClusterQueue without the flavor its label names or without cpu) is told by
a Warning Event on the ClusterQueue (or in the log when there is none), counted, and returned as
the step's reason: the other queues and the plan go on.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Protocol

from prometheus_client import Counter, Gauge

from tideshift.events.models import KueueQuotaLent, KueueQuotaStep, Resources, ServingNeed
from tideshift.events.subjects import KUEUE_QUOTA, SERVING_NEED
from tideshift.services.cluster.adapters.http import KubeHttp
from tideshift.services.cluster.adapters.kueue_queues import (
    KueueQuotaError,
    LentQueue,
    admitted_workloads,
    lent_queues,
    record_queue_event,
    set_active,
    write_quota,
)
from tideshift.services.cluster.core.kueue_quota import (
    Amount,
    QuotaConfig,
    QuotaInputs,
    decide,
    lendable,
    share,
    to_deactivate,
    to_reactivate,
)
from tideshift.services.common.bus.port import BusPort
from tideshift.services.common.clock import Clock

log = logging.getLogger("tideshift.executor.kueue")

QUOTA_CPU = Gauge(
    "tideshift_kueue_quota_cpu_cores", "cpu nominal quota lent to a Kueue ClusterQueue", ["queue"]
)
PREEMPTIONS = Counter(
    "tideshift_kueue_deactivations_total",
    "Admitted Kueue workloads Tideshift deactivated to give serving its room back",
    ["queue"],
)
ERRORS = Counter(
    "tideshift_kueue_quota_errors_total",
    "ClusterQueues whose quota could not be read or written (Warning Event on each)",
)
QUOTA_REASON = "TideshiftKueueQuota"


@dataclass(frozen=True, slots=True)
class QueueStep:
    queue: str
    quota: Amount | None
    changed: bool
    reason: str
    deactivated: tuple[str, ...] = ()  # namespace/name
    reactivated: tuple[str, ...] = ()
    error: bool = False


@dataclass
class KueueLender:
    """One lender per executor: remembers when each queue's quota last grew."""

    http: KubeHttp
    config: QuotaConfig = field(default_factory=QuotaConfig)
    weights: Mapping[str, float] = field(default_factory=dict)
    grown_at: dict[str, float] = field(default_factory=dict)

    def lend(self, need: ServingNeed, now: float) -> list[QueueStep]:
        """Quota to every labelled queue for one plan's serving need. The plan's `other`
        counts the pods of the jobs Kueue admitted (they are no target of Tideshift's): what
        the lent queues hold is taken out of it, and is their gang minimum."""
        try:
            queues, errors = lent_queues(self.http)
            held = Amount()
            for queue in queues:
                held = held + sum(
                    (w.usage for _, w in admitted_workloads(self.http, queue.name)
                     if not w.deactivated_by_us),
                    Amount(),
                )  # fmt: skip
        except KueueQuotaError as error:
            return [self._unreadable(error)]
        inputs = QuotaInputs(
            capacity=_amount(need.capacity),
            serving_lead=_amount(need.reserved),
            serving_must=_amount(need.expected),
            other=(_amount(need.other) - held).at_least_zero(),
            admitted_minimum=held,
        )
        return self._step(queues, errors, inputs, now)

    def step(self, inputs: QuotaInputs, now: float) -> list[QueueStep]:
        """Quota to every labelled queue for these inputs; what was done to each, and why."""
        try:
            queues, errors = lent_queues(self.http)
        except KueueQuotaError as error:
            return [self._unreadable(error)]
        return self._step(queues, errors, inputs, now)

    def _unreadable(self, error: KueueQuotaError) -> QueueStep:
        ERRORS.inc()
        log.warning("no quota lent to Kueue: %s", error)
        return QueueStep("", None, False, str(error), error=True)

    def _step(
        self, queues: list[LentQueue], errors: list[str], inputs: QuotaInputs, now: float
    ) -> list[QueueStep]:
        steps = [self._bad(message) for message in errors]
        if not queues:
            return steps
        total, why = lendable(inputs)
        shares = share(total, [q.name for q in queues], self.weights)
        for queue in queues:
            try:
                steps.append(self._lend(queue, shares[queue.name], why, inputs.capacity, now))
            except KueueQuotaError as error:
                steps.append(self._bad(str(error), queue.name))
        return steps

    def _lend(
        self, queue: LentQueue, target: Amount, why: str, capacity: Amount, now: float
    ) -> QueueStep:
        # A resource the flavor does not cover is not lent (its share stays unwritten).
        covered = Amount(
            target.cpu,
            target.memory if "memory" in queue.covered else 0.0,
            target.gpu if "nvidia.com/gpu" in queue.covered else 0.0,
        )
        decision = decide(
            covered,
            why,
            capacity=capacity,
            current=queue.quota,
            last_grown_at=self.grown_at.get(queue.name),
            now=now,
            config=self.config,
        )
        if decision.changed:
            write_quota(self.http, queue, decision.quota)
            if not decision.quota.fits_in(queue.quota):
                self.grown_at[queue.name] = now
            log.info("ClusterQueue %s: %s", queue.name, decision.reason)
        QUOTA_CPU.labels(queue.name).set(decision.quota.cpu)
        found = admitted_workloads(self.http, queue.name)
        by_name = {w.name: ns for ns, w in found}
        workloads = [w for _, w in found]
        out = to_deactivate(workloads, decision.quota)
        for name in out:
            set_active(self.http, by_name[name], name, active=False, queue=queue.name)
            PREEMPTIONS.labels(queue.name).inc()
        back = to_reactivate(workloads, decision.quota) if not out else []
        for name in back:
            set_active(self.http, by_name[name], name, active=True, queue=queue.name)
        return QueueStep(
            queue.name,
            decision.quota,
            decision.changed,
            decision.reason,
            tuple(f"{by_name[n]}/{n}" for n in out),
            tuple(f"{by_name[n]}/{n}" for n in back),
        )

    def _bad(self, message: str, queue: str = "") -> QueueStep:
        ERRORS.inc()
        log.warning("%s", message)
        name = queue or _queue_named(message)
        if name:
            self._warn(name, message)
        return QueueStep(name, None, False, message, error=True)

    def _warn(self, queue: str, message: str) -> None:
        try:
            record_queue_event(self.http, queue, reason=QUOTA_REASON, message=message)
        except KueueQuotaError as error:
            log.warning("%s", error)


def _queue_named(message: str) -> str:
    """The queue a read error names ("ClusterQueue NAME: ...")."""
    prefix = "ClusterQueue "
    if not message.startswith(prefix):
        return ""
    return message[len(prefix) :].split(":", 1)[0]


def _amount(resources: Resources) -> Amount:
    return Amount(resources.cpu, resources.memory, float(resources.gpu))


class QuotaLender(Protocol):
    """What the executor's lending loop calls (blocking, in a thread): `KueueLender`."""

    def lend(self, need: ServingNeed, now: float) -> list[QueueStep]: ...


def lent_event(plan_id: str, executor: str, steps: list[QueueStep], at: float) -> KueueQuotaLent:
    """The executor's result of one lending step: each queue's quota and why."""
    return KueueQuotaLent(
        plan_id=plan_id,
        executor=executor,
        at=datetime.fromtimestamp(at, UTC),
        queues=tuple(
            KueueQuotaStep(
                queue=step.queue,
                cpu=step.quota.cpu if step.quota else None,
                memory=step.quota.memory if step.quota else None,
                gpu=step.quota.gpu if step.quota else None,
                changed=step.changed,
                reason=step.reason[:1000],
                error=step.error,
                deactivated=step.deactivated,
                reactivated=step.reactivated,
            )
            for step in steps
        ),
    )


async def lend_from_plans(
    lender: QuotaLender,
    bus: BusPort,
    *,
    executor: str,
    clock: Clock,
    stopping: asyncio.Event,
) -> None:
    """Lend quota to Kueue for each plan's `ServingNeed` until `stopping` is set, and publish
    what was done (`KueueQuotaLent`, bad input's reason among it). Plans that arrive while a
    step runs are superseded by the latest; a step that fails is logged and the next plan
    tries again."""
    latest: ServingNeed | None = None
    arrived = asyncio.Event()

    async def receive() -> None:
        nonlocal latest
        needs = bus.subscribe(SERVING_NEED.filter(), consumer=f"{executor}-kueue", buffer=16)
        try:
            async for envelope in needs:
                latest = envelope.data
                arrived.set()
        except Exception as error:
            log.error("no quota lent to Kueue: plan.serving_need not followed: %s", error)
        finally:
            await needs.aclose()  # type: ignore[attr-defined]

    receiving = asyncio.create_task(receive())
    stop = asyncio.create_task(stopping.wait())
    try:
        while not stopping.is_set():
            wake = asyncio.create_task(arrived.wait())
            await asyncio.wait({wake, stop}, return_when=asyncio.FIRST_COMPLETED)
            wake.cancel()
            if stopping.is_set() or latest is None:
                continue
            arrived.clear()
            need, latest = latest, None
            now = clock.now()
            try:
                steps = await asyncio.to_thread(lender.lend, need, now)
                await bus.publish(KUEUE_QUOTA.at(), lent_event(need.plan_id, executor, steps, now))
            except Exception as error:  # the loop never stops on one plan
                ERRORS.inc()
                log.warning("quota for plan %s not lent to Kueue: %s", need.plan_id, error)
    finally:
        for task in (receiving, stop):
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
