"""The planner against a real nats-server with inputs at the edge of the contract: the
longest legal Kubernetes names through every subject, KV key and idempotency key; a target
the policy cannot plan is skipped while the others are planned; /readyz says when no plan
succeeds."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import UTC, datetime

import pytest
from pydantic import ValidationError

from tests.integration.planner.test_planner_service import (
    Collector,
    eventually,
    forecast,
    node,
    running,
    settings_for,
)
from tideshift.events import (
    DEMAND_OBSERVED,
    FORECAST,
    NODE_CHANGED,
    PLAN_DECIDED,
    SCALE_COMMAND,
    SCALE_RESULT,
    WORKLOAD_CHANGED,
    DemandObserved,
    PlanDecided,
    Resources,
    ScaleCommand,
    ScaleResult,
    WorkloadChanged,
    WorkloadRef,
)
from tideshift.events.models import ServingPolicy, TrainingPolicy
from tideshift.services.common.bus import Bus
from tideshift.services.executor.scale_cli import pin
from tideshift.services.planner import outputs, service
from tideshift.services.planner.settings import ServingTarget
from tideshift.services.watcher.core.snapshot import workload_key

GIB = 2**30


def longest_name(first: str) -> str:
    """253 characters (the most a DNS subdomain has), dots and dashes included."""
    name = (first + ".0-z" * 64)[:252] + "z"
    assert len(name) == 253
    return name


@pytest.fixture
async def long_ns(unique: str) -> str:
    return (unique + "-" + "n" * 63)[:62] + "z"  # 63 characters, a DNS label


async def collect(bus: Bus, subject: object, consumer: str) -> Collector:
    collector = Collector()
    await collector.start(bus, subject, consumer)
    return collector


@pytest.fixture
async def commands_and_plans(
    bus: Bus, unique: str, long_ns: str
) -> AsyncIterator[tuple[Collector, Collector]]:
    commands = await collect(bus, SCALE_COMMAND.filter(namespace=long_ns), f"c-{unique}")
    plans = await collect(bus, PLAN_DECIDED.filter(), f"p-{unique}")
    yield commands, plans
    await commands.stop()
    await plans.stop()


def announced(ref: WorkloadRef, role: str) -> WorkloadChanged:
    return WorkloadChanged(
        change="added",
        workload=ref,
        role=role,
        replicas=1,
        requests=Resources(cpu=1.0, memory=GIB),
        serving=ServingPolicy(capacity_rps=100.0, max_replicas=16) if role == "serving" else None,
        training=TrainingPolicy(max_replicas=8) if role == "training" else None,
        observed_at=datetime.now(UTC),
    )


async def test_the_longest_legal_names_work_through_every_subject_and_key(
    bus: Bus, unique: str, long_ns: str, commands_and_plans: tuple[Collector, Collector]
) -> None:
    commands, plans = commands_and_plans
    web = WorkloadRef(kind="Deployment", namespace=long_ns, name=longest_name("web"))
    job = WorkloadRef(kind="Job.batch.volcano.sh", namespace=long_ns, name=longest_name("job"))
    settings = settings_for(unique, serving=[], training=[])
    snapshot = await bus.kv(settings.snapshot_bucket)
    await snapshot.put(workload_key(web), announced(web, "serving"))  # found at bootstrap
    node_name = longest_name(f"n{unique}")
    await snapshot.put(f"node.{node_name.replace('.', '_2E')}", node(node_name, 32.0))
    await pin(bus, job, 3, until=None, reason="held", bucket=settings.pins_bucket)
    async with running(bus, settings, "p" * 100 + unique) as planner:
        job_event = announced(job, "training")
        await bus.publish(
            WORKLOAD_CHANGED.at(namespace=long_ns, kind=job.kind, name=job.name), job_event
        )
        await bus.publish(NODE_CHANGED.at(name=node_name), node(node_name, 32.0))
        issued = forecast(unique, 500.0).model_copy(update={"workload": web})
        await bus.publish(FORECAST.at(namespace=long_ns, workload=web.name), issued)
        reading = DemandObserved(workload=web, rps=900.0, observed_at=datetime.now(UTC))
        await bus.publish(DEMAND_OBSERVED.at(namespace=long_ns, workload=web.name), reading)

        def sent() -> list[ScaleCommand]:
            return [c for c in commands.items if c.target == web]

        await eventually(lambda: any(c.desired >= 9 for c in sent()))  # 900 req/s / 100
        command = sent()[-1]
        assert len(command.idempotency_key) <= outputs.KEY_LIMIT
        assert len(command.plan_id) <= service.PLAN_ID_LIMIT

        def held_job() -> bool:
            return any(
                t.target == job and t.desired == 3
                for p in plans.items
                if isinstance(p, PlanDecided)
                for t in p.targets
            )

        await eventually(held_job)  # the pin, under the job's encoded identity, is honoured

        result = ScaleResult(
            target=web,
            idempotency_key=command.idempotency_key,
            outcome="applied",
            previous=1,
            current=command.desired,
            desired=command.desired,
            executed_at=datetime.now(UTC),
        )
        await bus.publish_durable(
            SCALE_RESULT.at(namespace=long_ns, kind=web.kind, name=web.name),
            result,
            msg_id=f"r-{unique}",
        )
        await eventually(lambda: planner.state.confirmed.get(web) == command.desired)
        assert planner.state.table.view().allocatable[:, 0].max() == 32.0


def test_a_rate_the_policy_cannot_plan_is_refused_naming_the_field() -> None:
    """A capacity so small that replicas overflow used to reach the planning loop (which skips a
    target whose plan raises: tests/unit/planner/test_planner_isolation.py); the serving spec's
    bounds now refuse it when settings (or annotations) are read, naming the field."""
    with pytest.raises(ValidationError, match=r"capacity_rps\n.*greater than or equal to 0.001"):
        ServingTarget(namespace="ns", name="bad", cpu=1.0, capacity_rps=5e-324)


async def test_readyz_reports_degraded_while_no_plan_succeeds(
    bus: Bus, unique: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    class Broken:
        name = "broken"

        def initial_state(self) -> None:
            return None

        def plan(self, inputs: object, state: None, now: float) -> None:
            raise RuntimeError("always")

    monkeypatch.setattr(service, "PLAN_STALL_SECONDS", 0.5)
    async with running(bus, settings_for(unique), f"a-{unique}") as planner:
        await eventually(lambda: planner.plans >= 1 and planner.readiness() == [])
        working = planner.policy
        planner.policy = Broken()  # type: ignore[assignment]
        await eventually(lambda: bool(planner.readiness()))
        assert planner.readiness()[0].startswith("degraded: no plan succeeded for")
        planner.policy = working
        await eventually(lambda: planner.readiness() == [])


async def test_a_target_that_left_is_forgotten(
    bus: Bus, unique: str, long_ns: str, commands_and_plans: tuple[Collector, Collector]
) -> None:
    commands, _ = commands_and_plans
    web = WorkloadRef(kind="Deployment", namespace=long_ns, name=f"web-{unique}")
    subject = WORKLOAD_CHANGED.at(namespace=long_ns, kind=web.kind, name=web.name)
    settings = settings_for(unique, serving=[], training=[])
    await bus.publish(NODE_CHANGED.at(name=f"n-{unique}"), node(f"n-{unique}", 16.0))
    async with running(bus, settings, f"a-{unique}") as planner:
        added = announced(web, "serving")
        await bus.publish(subject, added)
        issued = forecast(unique, 500.0).model_copy(update={"workload": web})
        await bus.publish(FORECAST.at(namespace=long_ns, workload=web.name), issued)
        await eventually(lambda: any(c.target == web for c in commands.items))
        await eventually(lambda: web in planner.sent)
        gone = added.model_copy(update={"change": "deleted", "observed_at": datetime.now(UTC)})
        await bus.publish(subject, gone)
        await eventually(lambda: web not in planner.sent)
        assert web not in planner.state.forecasts
        assert web not in planner.state.known
