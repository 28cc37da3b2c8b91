"""Quota lent to Kueue, wired through the services on the in-memory bus and virtual time: the
real planner publishes serving's need beside each plan (`plan.serving_need`), the real
executor service's lending loop hands it to its lender and publishes what was done
(`kueue.quota`), a queue's bad input with its reason. The lender here is a stand-in that
applies the pure rule (`lendable`) and names one bad queue: its Kubernetes side is tested
against the real Kueue in tests/k8s/engines/test_engines_kueue_wired.py."""

from __future__ import annotations

import functools
from typing import Any

from tests.fixtures.support import StandInPredictor, collect, eventually, node_changed, running
from tests.unit.services.test_service_planner import NS
from tests.unit.services.test_service_planner import settings as planner_settings
from tideshift import events
from tideshift.events.models import KueueQuotaLent, ServingNeed
from tideshift.events.subjects import KUEUE_QUOTA, SERVING_NEED
from tideshift.services.cluster.core.kueue_quota import Amount, QuotaInputs, lendable
from tideshift.services.cluster.sim import SimCluster, SimClusterPort
from tideshift.services.common.bus.memory import MemoryBroker, MemoryBus
from tideshift.services.common.clock import ManualClock
from tideshift.services.executor import service as executor_service
from tideshift.services.executor.kueue_lending import QueueStep
from tideshift.services.executor.service import ExecutorSettings
from tideshift.services.planner import service as planner_service

BAD = "ClusterQueue broken: label tideshift.io/lend-quota='gpu' names no flavor"


class RuleLender:
    """Lends by the pure rule what each need leaves; one labelled queue is always bad."""

    def __init__(self) -> None:
        self.needs: list[ServingNeed] = []

    def lend(self, need: ServingNeed, now: float) -> list[QueueStep]:
        self.needs.append(need)

        def amount(r: events.Resources) -> Amount:
            return Amount(r.cpu, r.memory, float(r.gpu))

        quota, why = lendable(
            QuotaInputs(
                amount(need.capacity),
                amount(need.reserved),
                amount(need.expected),
                amount(need.other),
                Amount(),
            )
        )
        return [QueueStep("training", quota, True, why), QueueStep("broken", None, False, BAD,
                                                                    error=True)]  # fmt: skip


async def test_serving_need_reaches_the_lender_and_the_quota_follows_the_forecast(
    broker: MemoryBroker, bus: MemoryBus, clock: ManualClock
) -> None:
    lent: list[KueueQuotaLent] = []
    needs: list[ServingNeed] = []
    tasks = [
        await collect(bus, KUEUE_QUOTA.filter(), lent),
        await collect(bus, SERVING_NEED.filter(), needs),
    ]
    lender = RuleLender()
    planner = planner_settings()
    executor: ExecutorSettings = ExecutorSettings(health_port=-1, kueue_lending=True)
    executing = functools.partial(
        executor_service.serve,
        executor,
        clock=clock,
        cluster=SimClusterPort(SimCluster(now=0.0)),
        lender=lender,
    )
    planning = functools.partial(planner_service.serve, planner, clock=clock)

    def quota_of(item: KueueQuotaLent) -> Any:
        return next(q for q in item.queues if q.queue == "training").cpu

    async with (
        running(broker, "executor", executor, executing),
        running(broker, "planner", planner, planning),
    ):
        await bus.publish(events.NODE_CHANGED.at(name="n1"), node_changed("n1", cpu=16.0))
        predictor = StandInPredictor(bus, clock)
        # 300 req/s at 100 a replica of 1 cpu: serving needs 3 of the node's 16 cpu.
        await predictor.forecast(NS, "web", [300.0] * 10)
        await eventually(
            lambda: any(quota_of(x) == 13.0 for x in lent), message="quota never 16 - 3 cpu"
        )
        # Serving's forecast rises to 900 req/s: 9 cpu reserved, the quota follows to 7.
        await predictor.forecast(NS, "web", [900.0] * 10)
        await clock.advance(planner.tick_seconds)
        await eventually(
            lambda: any(quota_of(x) == 7.0 for x in lent), message="quota never 16 - 9 cpu"
        )
    for task in tasks:
        task.cancel()
    # The need the planner published is the one the lender got, in the contract's units.
    assert lender.needs and lender.needs[-1] in needs
    last = lender.needs[-1]
    assert (last.capacity.cpu, last.reserved.cpu, last.expected.cpu) == (16.0, 9.0, 9.0)
    assert last.reserved.memory == 9 * 2.0**30
    # Bad input of a queue reaches the executor's published result with its reason.
    bad = [q for x in lent for q in x.queues if q.queue == "broken"]
    assert bad and all(q.error and q.reason == BAD and q.cpu is None for q in bad)
    assert {x.plan_id for x in lent} <= {n.plan_id for n in needs}
