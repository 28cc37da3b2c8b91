"""`tideshift explain` and `tideshift status` against a real nats-server: plans and planner
statuses published as the planner does (core NATS), scale commands consumed by the real
executor over the simulated cluster, all kept by the history stream the executor creates;
what the commands print is read back as JSON and as text.

Only the executor's cluster is simulated (the Kubernetes side is tests/k8s/test_operator_*).
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from prometheus_client import REGISTRY

from tideshift.events import (
    LEASES_BUCKET,
    PLAN_DECIDED,
    PLANNER_STATUS,
    SCALE_COMMAND,
    SNAPSHOT_BUCKET,
    NodeChanged,
    PlanDecided,
    PlannerStatus,
    PodChanged,
    Resources,
    ScaleCommand,
    ServingPolicy,
    TargetDecision,
    TrainingPolicy,
    WorkloadChanged,
    WorkloadRef,
)
from tideshift.events.models import Headroom
from tideshift.services.cluster.port import Node
from tideshift.services.cluster.port import Resources as PortResources
from tideshift.services.cluster.sim import SimCluster, SimClusterPort, SimWorkload
from tideshift.services.common.bus import Bus
from tideshift.services.common.embedded_nats import EmbeddedNats
from tideshift.services.common.runtime import ServiceContext
from tideshift.services.executor import service as executor_service
from tideshift.services.executor.executor import Executor, RecordStore
from tideshift.services.executor.service import ExecutorSettings, consume
from tideshift.services.insight import cli
from tideshift.services.insight.cli import LeaseValue
from tideshift.services.watcher.core.snapshot import node_key, pod_key, workload_key

WAIT = 20.0
REASON = "forecast q0.95 peak 48.0 req/s over the next 90 s / 10 req/s per replica = 5"
HEADROOM = Headroom(forecast=48.0, rise=30.0, rise_ratio=1.5, observed=20.0, panic_hold=False)


async def eventually(check: Callable[[], Any], what: str) -> Any:
    """The check's first truthy answer; fails after WAIT seconds."""
    deadline = asyncio.get_running_loop().time() + WAIT
    while not (answer := await check()):
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.1)
    return answer


@contextlib.asynccontextmanager
async def executing(
    bus: Bus, cluster: SimCluster, unique: str, **options: Any
) -> AsyncIterator[Any]:
    """The real executor consuming this test's commands; yields its cluster port."""
    port = SimClusterPort(cluster)
    executor = Executor(port, RecordStore(await bus.kv(f"exec_{unique}")), name="x", **options)
    executor.events = port
    ready = asyncio.Event()
    task = asyncio.create_task(
        consume(
            executor,
            bus,
            durable=f"d{unique}",
            subject=SCALE_COMMAND.filter(namespace=unique),
            ready=ready,
        )
    )
    await ready.wait()
    try:
        yield port
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


def sim(namespace: str) -> SimCluster:
    cluster = SimCluster(now=0.0)
    cluster.add_node(Node("n1", PortResources(cpu=32, memory=128 * 2**30)))
    cluster.add_workload(
        SimWorkload(
            ref=WorkloadRef(namespace, "Deployment", "web"),
            kind="Deployment",
            role="serving",
            pod_requests=PortResources(cpu=0.5),
            replicas=2,
        )
    )
    return cluster


async def plan_and_command(bus: Bus, web: WorkloadRef, *, policy: str, plan_id: str) -> None:
    """What the leading planner publishes for one change: the command, then the plan."""
    now = datetime.now(UTC)
    command = ScaleCommand(
        target=web,
        desired=5,
        reason=REASON,
        plan_id=plan_id,
        issued_at=now,
        idempotency_key=plan_id,
    )
    where = {"namespace": web.namespace, "kind": web.kind, "name": web.name}
    await bus.publish_durable(SCALE_COMMAND.at(**where), command, msg_id=plan_id)
    decided = TargetDecision(target=web, current=2, desired=5, reason=REASON, headroom=HEADROOM)
    plan = PlanDecided(plan_id=plan_id, policy=policy, decided_at=now, targets=(decided,))
    await bus.publish(PLAN_DECIDED.at(policy=policy), plan)


def run_cli(main: Callable[[list[str]], int], argv: list[str]) -> Callable[[], Any]:
    """A check that runs the command (in a thread: it runs its own event loop) and returns
    (exit code, stdout, stderr)."""

    async def check() -> tuple[int, str, str]:
        out, err = io.StringIO(), io.StringIO()

        def call() -> int:
            # Process-wide, but nothing else prints while the command runs.
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
                try:
                    return main(argv)
                except SystemExit as exit_:  # argparse's usage errors
                    return int(exit_.code or 0)

        code = await asyncio.to_thread(call)
        return code, out.getvalue(), err.getvalue()

    return check


@pytest.fixture
async def history(bus: Bus) -> Bus:
    """The history stream as the executor creates it (short limits: a test's)."""
    await bus.ensure_streams((ExecutorSettings(history_max_age_hours=1).history_stream(),))
    return bus


async def test_explain_shows_the_decision_its_sizing_and_what_the_executor_did(
    history: Bus, nats_server: EmbeddedNats, unique: str
) -> None:
    web = WorkloadRef(unique, "Deployment", "web")
    cluster = sim(unique)
    argv = ["deploy/web", "-n", unique, "--nats-url", nats_server.url, "-o", "json"]
    async with executing(history, cluster, unique):
        await plan_and_command(history, web, policy=f"p{unique}", plan_id=f"plan-{unique}")

        async def applied() -> Any:
            code, out, _ = await run_cli(cli.explain_main, argv)()
            steps = json.loads(out)["steps"] if code == 0 else []
            done = steps and steps[0]["executed"] and steps[0]["executed"][0]["outcome"]
            return steps if done else None

        steps = await eventually(applied, "explain to show the applied command")
    (step,) = steps
    assert (step["current"], step["desired"], step["reason"]) == (2, 5, REASON)
    assert (step["forecast_rps"], step["observed_rps"], step["rise_rps"]) == (48.0, 20.0, 30.0)
    (executed,) = step["executed"]
    assert (executed["outcome"], executed["previous"], executed["current"]) == ("applied", 2, 5)
    assert cluster.scale_state(web).replicas == 5
    at = datetime.now(UTC).isoformat()
    code, out, _ = await run_cli(cli.explain_main, [*argv, "--since", "2h", "--at", at])()
    assert code == 2  # --since and --at exclude each other (argparse says so and exits 2)
    code, out, _ = await run_cli(cli.explain_main, [*argv, "--at", at])()
    assert code == 0 and [s["desired"] for s in json.loads(out)["steps"]] == [5]
    before = (datetime.now(UTC) - timedelta(hours=1)).isoformat()
    code, _, err = await run_cli(cli.explain_main, [*argv, "--at", before])()
    assert code == 2 and "unknown target" in err
    code, _, err = await run_cli(cli.explain_main, [*argv, "--at", "yesterday"])()
    assert code == 2 and "--at: expected an ISO 8601 time" in err
    code, text, _ = await run_cli(cli.explain_main, argv[:-2])()
    assert code == 0
    assert "2 -> 5  forecast 48.0, observed 20.0, rise 30.0 (x1.50) req/s" in text
    assert f"why: {REASON}" in text and "executor: applied 2 -> 5 at " in text


async def test_observe_mode_shows_what_would_have_been_done_beside_the_cluster(
    history: Bus, nats_server: EmbeddedNats, unique: str
) -> None:
    web = WorkloadRef(unique, "Deployment", "web")
    cluster = sim(unique)
    argv = ["deploy/web", "-n", unique, "--nats-url", nats_server.url]
    async with executing(history, cluster, unique, observe=True) as port:
        await plan_and_command(history, web, policy=f"p{unique}", plan_id=f"plan-{unique}")

        async def told() -> Any:
            code, out, _ = await run_cli(cli.explain_main, argv)()
            return out if code == 0 and "would_scale" in out else None

        text = await eventually(told, "explain to show the would_scale result")
    assert "executor: would_scale 2 -> 5 at " in text and "observe mode: would set 5" in text
    assert cluster.scale_state(web).replicas == 2
    assert [(reason, message) for _, reason, message in port.events] == [
        ("TideshiftWouldScale", f"would scale 2 -> 5: {REASON}")
    ]


async def test_status_shows_planners_workloads_jobs_and_what_nodes_lend(
    history: Bus, nats_server: EmbeddedNats, unique: str
) -> None:
    web = WorkloadRef(unique, "Deployment", "web")
    job = WorkloadRef(unique, "Job.batch.volcano.sh", "ctr")
    node, now = f"node-{unique}", datetime.now(UTC)
    snapshot = await history.kv(SNAPSHOT_BUCKET)
    borrows = Resources(cpu=0.5, memory=2**30)
    await snapshot.put(
        workload_key(web),
        WorkloadChanged(
            change="added", workload=web, role="serving", replicas=4, ready_replicas=3,
            requests=Resources(cpu=0.5), serving=ServingPolicy(capacity_rps=10), observed_at=now,
        ),
    )  # fmt: skip
    await snapshot.put(
        workload_key(job),
        WorkloadChanged(
            change="added", workload=job, role="training", replicas=2, ready_replicas=2,
            requests=borrows, training=TrainingPolicy(batch=True), observed_at=now,
        ),
    )  # fmt: skip
    await snapshot.put(
        node_key(node),
        NodeChanged(change="added", name=node, allocatable=Resources(cpu=8, memory=32 * 2**30),
                    observed_at=now),
    )  # fmt: skip
    for index in range(2):
        await snapshot.put(
            pod_key(unique, f"ctr-{index}"),
            PodChanged(change="added", namespace=unique, name=f"ctr-{index}", phase="Running",
                       node=node, owner=job, role="training", observed_at=now),
        )  # fmt: skip
    planner = f"planner-{unique}"
    status = PlannerStatus(
        planner=planner, leader=True, mode="degraded", reasons=("forecasts stale",), at=now
    )
    await history.publish(PLANNER_STATUS.at(planner=planner), status)
    leases = await history.kv(LEASES_BUCKET)
    await leases.put(f"lease{unique}", LeaseValue(holder=planner, expires_at=now.timestamp() + 600))
    plan = PlanDecided(
        plan_id=f"plan-{unique}",
        policy=f"p{unique}",
        decided_at=now + timedelta(seconds=1),  # after any other test's plan
        targets=(
            TargetDecision(target=web, current=4, desired=5, reason=REASON, headroom=HEADROOM),
            TargetDecision(
                target=job, current=2, desired=1, reason="-1 trainers: serving needs n1"
            ),
        ),
    )
    await history.publish(PLAN_DECIDED.at(policy=plan.policy), plan)
    argv = ["--nats-url", nats_server.url, "--lease-name", f"lease{unique}", "-o", "json"]

    async def shown() -> Any:
        code, out, _ = await run_cli(cli.status_main, argv)()
        return json.loads(out) if code == 0 and unique in out else None

    seen = await eventually(shown, "status to show this test's plan")
    assert seen["plan_id"] == plan.plan_id
    (ours,) = [p for p in seen["planners"] if p["name"] == planner]
    assert (ours["leader"], ours["mode"], ours["reasons"]) == (
        True,
        "degraded",
        ["forecasts stale"],
    )
    (serving,) = [row for row in seen["serving"] if row["target"] == str(web)]
    assert (serving["ready"], serving["replicas"], serving["planned"]) == (3, 4, 5)
    assert (serving["demand_rps"], serving["forecast_rps"], serving["why"]) == (20.0, 48.0, REASON)
    (training,) = [row for row in seen["jobs"] if row["target"] == str(job)]
    assert (training["replicas"], training["planned"], training["batch"]) == (2, 1, True)
    (lending,) = [row for row in seen["nodes"] if row["name"] == node]
    assert (lending["batch_pods"], lending["lent_cpu"], lending["lent_memory_gib"]) == (2, 1.0, 2.0)
    code, text, _ = await run_cli(cli.status_main, argv[:-2])()
    assert code == 0 and f"planner {planner}: leader, degraded: forecasts stale" in text
    assert f"{node}: 8 cpu, 32.0 GiB; lends 1 cpu, 2.0 GiB to 2 batch pods" in text


async def test_errors_are_one_line_with_exit_2(
    history: Bus, nats_server: EmbeddedNats, unique: str
) -> None:
    argv = ["deploy/nothing", "-n", unique, "--nats-url", nats_server.url]
    code, out, err = await run_cli(cli.explain_main, argv)()
    assert (code, out) == (2, "")
    assert err.startswith(f"tideshift explain: unknown target Deployment.apps/{unique}/nothing")
    assert err.count("\n") == 1
    code, _, err = await run_cli(
        cli.status_main, ["--nats-url", "nats://127.0.0.1:1", "--timeout", "1"]
    )()
    assert code == 2 and err.startswith("tideshift status: cannot reach NATS at nats://127.0.0.1:1")


async def test_the_executor_service_keeps_the_history_with_its_limits_and_says_its_mode(
    bus: Bus, unique: str
) -> None:
    settings = ExecutorSettings(
        mode="observe",
        durable=f"d{unique}",
        record_bucket=f"exec_{unique}",
        history_max_age_hours=30,
        history_max_bytes=2**26,
        history_max_messages=20_000,
    )
    context = ServiceContext(name="executor", settings=settings, bus=bus, instance=unique)
    port = SimClusterPort(sim(unique))
    task = asyncio.create_task(executor_service.serve(settings, context, cluster=port))
    try:
        await asyncio.wait_for(context.ready.wait(), WAIT)
        info = await bus.js.stream_info("TIDESHIFT_HISTORY")
        limits = (info.config.max_age, info.config.max_bytes, info.config.max_msgs)
        assert limits == (30 * 3600, 2**26, 20_000)
        assert REGISTRY.get_sample_value("tideshift_executor_observe_mode") == 1
    finally:
        context.stopping.set()
        await asyncio.wait_for(task, WAIT)


async def test_without_a_history_explain_fails_and_status_shows_the_cluster(
    bus: Bus, nats_server: EmbeddedNats, unique: str
) -> None:
    with contextlib.suppress(Exception):  # absent already: the point of the test
        await bus.js.delete_stream("TIDESHIFT_HISTORY")
    argv = ["--nats-url", nats_server.url]
    code, _, err = await run_cli(cli.explain_main, ["deploy/web", "-n", unique, *argv])()
    assert code == 2
    assert err == (
        "tideshift explain: no decision history: stream TIDESHIFT_HISTORY does not exist "
        "(the executor creates it)\n"
    )
    code, out, err = await run_cli(cli.status_main, argv)()
    assert code == 0 and "latest plan: none kept" in out
    assert err.startswith("tideshift status: no decision history")


async def test_explain_and_status_as_the_operator_on_an_authenticated_bus(
    unique: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Logins on, streams provisioned: the executor keeps the history, the planner's plan and
    the operator's command land in it, and the operator's login reads them back."""
    web = WorkloadRef(unique, "Deployment", "web")
    with EmbeddedNats(auth=True) as server:

        async def login(role: str) -> Bus:
            password = server.passwords[role]
            return await Bus.connect(server.url, name=role, user=role, password=password)

        executor, planner, operator = [
            await login(role) for role in ("executor", "planner", "operator")
        ]
        try:
            await executor.ensure_streams((ExecutorSettings().history_stream(),))
            now = datetime.now(UTC)
            command = ScaleCommand(
                target=web, desired=5, reason=REASON, plan_id="op", issued_at=now,
                idempotency_key=f"k{unique}", issuer="operator",
            )  # fmt: skip
            where = {"namespace": unique, "kind": web.kind, "name": web.name}
            await operator.publish_durable(SCALE_COMMAND.at(**where), command)
            decided = TargetDecision(target=web, current=2, desired=4, reason=REASON)
            plan = PlanDecided(plan_id="p1", policy="tideshift", decided_at=now, targets=(decided,))
            await planner.publish(PLAN_DECIDED.at(policy="tideshift"), plan)
        finally:
            for bus in (executor, planner, operator):
                await bus.close()
        monkeypatch.setenv("TIDESHIFT_NATS_USER", "operator")
        monkeypatch.setenv("TIDESHIFT_NATS_PASSWORD", server.passwords["operator"])
        argv = ["deploy/web", "-n", unique, "--nats-url", server.url, "-o", "json"]

        async def both() -> Any:
            code, out, _ = await run_cli(cli.explain_main, argv)()
            steps = json.loads(out)["steps"] if code == 0 else []
            return steps if len(steps) == 2 else None

        steps = await eventually(both, "the plan and the operator's command in explain")
        assert [(s["desired"], s["reason"]) for s in steps] == [
            (4, REASON),
            (5, f"operator: {REASON}"),
        ]
        code, out, err = await run_cli(cli.status_main, ["--nats-url", server.url])()
        assert (code, err) == (0, "") and f"Deployment.apps/{unique}/web: ?/? -> 4" in out
        monkeypatch.setenv("TIDESHIFT_NATS_USER", "reaction")
        monkeypatch.setenv("TIDESHIFT_NATS_PASSWORD", server.passwords["reaction"])
        code, _, err = await run_cli(cli.explain_main, [*argv, "--timeout", "3"])()
        assert code == 2 and err.startswith("tideshift explain: NATS did not answer reading")
