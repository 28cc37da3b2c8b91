"""The executor against a real control plane and a real nats-server.

Commands are applied with a ServiceAccount bound to exactly the `tideshift-executor`
ClusterRole of charts/tideshift/files/rbac.yaml. Volcano and PyTorchJob objects use minimal
structural CRDs with the upstream group, version and kind (tests/k8s/cluster_objects.py).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from kubernetes.client.exceptions import ApiException

from tests.k8s.cluster_objects import (
    batch_job,
    collection,
    create,
    deployment,
    pytorch_job,
    service_kubeconfig,
    statefulset,
    volcano_job,
    wait_until,
)
from tideshift.events import SCALE_COMMAND, SCALE_RESULT, ScaleCommand, WorkloadRef
from tideshift.services.cluster.adapters.http import MERGE_PATCH, KubeHttp
from tideshift.services.cluster.kubernetes import SCALE_CONFLICTS, KubernetesClusterPort
from tideshift.services.common.bus import Bus
from tideshift.services.executor import scale_cli
from tideshift.services.executor.executor import Executor, RecordStore
from tideshift.services.executor.service import consume

pytestmark = pytest.mark.k8s
WAIT = 60.0
T0 = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)


@pytest.fixture
def executor_kubeconfig(
    admin: KubeHttp, k8s_namespace: str, k8s_service_account_kubeconfig: Callable[..., Path]
) -> Path:
    return service_kubeconfig(admin, k8s_namespace, "executor", k8s_service_account_kubeconfig)


def executor_port(kubeconfig: Path, namespace: str, **options: Any) -> KubernetesClusterPort:
    port = KubernetesClusterPort.from_kubeconfig(kubeconfig, **options)

    def allowed() -> bool:
        review = port.http.json(
            "POST",
            "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews",
            body={
                "apiVersion": "authorization.k8s.io/v1",
                "kind": "SelfSubjectAccessReview",
                "spec": {
                    "resourceAttributes": {
                        "namespace": namespace,
                        "group": "kubeflow.org",
                        "resource": "pytorchjobs",
                        "verb": "patch",
                    }
                },
            },
        )
        return bool(review.get("status", {}).get("allowed"))

    wait_until(allowed, timeout=30, what="the executor role to take effect")
    return port


@contextlib.asynccontextmanager
async def executor_on(
    bus: Bus, kubeconfig: Path, namespace: str, unique: str, **options: Any
) -> AsyncIterator[Executor]:
    port_options = {k: options.pop(k) for k in ("before_write",) if k in options}
    port = await asyncio.to_thread(executor_port, kubeconfig, namespace, **port_options)
    records = RecordStore(await bus.kv(f"exec_{unique}"))
    try:
        yield Executor(port, records, name="test", **options)
    finally:
        await port.close()


def joined(body: dict[str, Any], role: str = "serving") -> dict[str, Any]:
    """The object labelled `tideshift.io/role`: it joined Tideshift, the executor may scale it."""
    body["metadata"].setdefault("labels", {})["tideshift.io/role"] = role
    return body


def command(target: WorkloadRef, desired: int, key: str, issued_at: datetime = T0) -> ScaleCommand:
    return ScaleCommand(
        target=target,
        desired=desired,
        reason="test",
        plan_id="p",
        issued_at=issued_at,
        idempotency_key=key,
    )


READERS: dict[str, Callable[[dict[str, Any]], int]] = {
    "Deployment.apps": lambda obj: obj["spec"]["replicas"],
    "StatefulSet.apps": lambda obj: obj["spec"]["replicas"],
    "Job.batch": lambda obj: obj["spec"]["parallelism"],
    "Job.batch.volcano.sh": lambda obj: next(
        t["replicas"] for t in obj["spec"]["tasks"] if t["name"] == "worker"
    ),
    "PyTorchJob.kubeflow.org": lambda obj: obj["spec"]["pytorchReplicaSpecs"]["Worker"]["replicas"],
}


def replicas_in_apiserver(admin: KubeHttp, target: WorkloadRef) -> int:
    obj = admin.get(f"{collection(target.kind, target.namespace)}/{target.name}")
    return READERS[target.kind](obj)


@pytest.mark.parametrize(
    ("kind", "body", "desired", "expected"),
    [
        ("Deployment.apps", joined(deployment("web", 1)), 3, 3),
        ("StatefulSet.apps", joined(statefulset("db", 1)), 2, 2),
        ("Job.batch", joined(batch_job("batch", 1)), 4, 4),
        # Volcano: the job needs 3 of ps(1) + workers: workers may not go below 2.
        ("Job.batch.volcano.sh", joined(volcano_job("vc", workers=4, min_available=3)), 0, 2),
        # PyTorchJob: within elasticPolicy [1, 4].
        ("PyTorchJob.kubeflow.org", joined(pytorch_job("pt", workers=2, low=1, high=4)), 10, 4),
    ],
)
async def test_each_adapter_scales_a_real_object_within_its_bounds(
    admin: KubeHttp,
    k8s_namespace: str,
    executor_kubeconfig: Path,
    bus: Bus,
    unique: str,
    kind: str,
    body: dict[str, Any],
    desired: int,
    expected: int,
) -> None:
    await asyncio.to_thread(create, admin, collection(kind, k8s_namespace), body)
    target = WorkloadRef(k8s_namespace, kind, body["metadata"]["name"])
    async with executor_on(bus, executor_kubeconfig, k8s_namespace, unique) as executor:
        before = await asyncio.to_thread(replicas_in_apiserver, admin, target)
        result = await executor.handle(command(target, desired, "k1"))
        assert result.outcome == "applied", result.message
        assert (result.previous, result.current) == (before, expected)
        assert await asyncio.to_thread(replicas_in_apiserver, admin, target) == expected
        if expected != desired:
            assert "clamped" in result.message

        # Replayed and stale commands change nothing.
        replay = await executor.handle(command(target, desired, "k1"))
        stale = await executor.handle(command(target, 1, "k0", T0 - timedelta(minutes=5)))
        assert (replay.outcome, stale.outcome) == ("noop", "noop")
        assert stale.message.startswith("stale")
        assert await asyncio.to_thread(replicas_in_apiserver, admin, target) == expected


async def test_volcano_scale_keeps_the_job_valid_and_other_tasks_untouched(
    admin: KubeHttp, k8s_namespace: str, executor_kubeconfig: Path, bus: Bus, unique: str
) -> None:
    body = joined(volcano_job("gang", workers=2, min_available=3))
    await asyncio.to_thread(create, admin, collection("Job.batch.volcano.sh", k8s_namespace), body)
    target = WorkloadRef(k8s_namespace, "Job.batch.volcano.sh", "gang")
    async with executor_on(bus, executor_kubeconfig, k8s_namespace, unique) as executor:
        result = await executor.handle(command(target, 6, "grow"))
    assert result.outcome == "applied"
    obj = await asyncio.to_thread(
        admin.get, f"{collection('Job.batch.volcano.sh', k8s_namespace)}/gang"
    )
    tasks = {task["name"]: task for task in obj["spec"]["tasks"]}
    assert tasks["worker"]["replicas"] == 6 and tasks["ps"]["replicas"] == 1
    assert tasks["ps"]["template"] == body["spec"]["tasks"][0]["template"]
    assert obj["spec"]["minAvailable"] <= sum(task["replicas"] for task in tasks.values())


async def test_unknown_kinds_are_rejected_with_a_reason(
    k8s_namespace: str, executor_kubeconfig: Path, bus: Bus, unique: str
) -> None:
    target = WorkloadRef(k8s_namespace, "DaemonSet", "agents")
    async with executor_on(bus, executor_kubeconfig, k8s_namespace, unique) as executor:
        result = await executor.handle(command(target, 2, "u"))
        missing = await executor.handle(
            command(WorkloadRef(k8s_namespace, "Deployment", "no"), 2, "m")
        )
    assert (
        result.outcome == "rejected"
        and "no scale adapter for kind 'DaemonSet.apps'" in result.message
    )
    assert missing.outcome == "rejected" and "not found" in missing.message


async def test_an_object_that_did_not_join_is_rejected_and_left_alone(
    admin: KubeHttp, k8s_namespace: str, executor_kubeconfig: Path, bus: Bus, unique: str
) -> None:
    # The executor's RBAC reaches every Deployment; the label, not RBAC, decides.
    await asyncio.to_thread(
        create, admin, collection("Deployment", k8s_namespace), deployment("stranger", 1)
    )
    target = WorkloadRef(k8s_namespace, "Deployment", "stranger")
    async with executor_on(bus, executor_kubeconfig, k8s_namespace, unique) as executor:
        executor.events = executor.port  # type: ignore[assignment]
        results = [await executor.handle(command(target, 4, f"s{i}")) for i in range(3)]
    for result in results:
        assert result.outcome == "rejected"
        assert result.message.startswith(f"not managed: {target} has no label tideshift.io/role")
    assert await asyncio.to_thread(replicas_in_apiserver, admin, target) == 1
    # Told to the owner once, with the repeats counted (with the executor's own RBAC).
    events = await asyncio.to_thread(admin.get, f"/api/v1/namespaces/{k8s_namespace}/events")
    refused = [e for e in events["items"] if e["reason"] == "TideshiftRefused"]
    assert len(refused) == 1
    assert refused[0]["count"] == 3 and refused[0]["type"] == "Warning"
    assert refused[0]["involvedObject"]["name"] == "stranger"
    assert "tideshift.io/role" in refused[0]["message"]


async def test_a_conflict_is_re_read_and_retried(
    admin: KubeHttp, k8s_namespace: str, executor_kubeconfig: Path, bus: Bus, unique: str
) -> None:
    await asyncio.to_thread(
        create, admin, collection("Job", k8s_namespace), joined(batch_job("cj", 1))
    )
    target = WorkloadRef(k8s_namespace, "Job", "cj")
    path = f"{collection('Job', k8s_namespace)}/cj"

    def interfere(_target: WorkloadRef, attempt: int) -> None:
        if attempt == 0:  # someone else writes between our read and our write
            admin.json(
                "PATCH",
                path,
                body={"metadata": {"annotations": {"other-writer": "was-here"}}},
                content_type=MERGE_PATCH,
            )

    conflicts_before = SCALE_CONFLICTS._value.get()
    async with executor_on(
        bus, executor_kubeconfig, k8s_namespace, unique, before_write=interfere
    ) as executor:
        result = await executor.handle(command(target, 5, "c"))
    assert result.outcome == "applied" and result.current == 5
    assert SCALE_CONFLICTS._value.get() == conflicts_before + 1
    obj = await asyncio.to_thread(admin.get, path)
    assert obj["spec"]["parallelism"] == 5
    assert obj["metadata"]["annotations"]["other-writer"] == "was-here"  # not overwritten


async def test_annotation_bounds_and_dry_run(
    admin: KubeHttp, k8s_namespace: str, executor_kubeconfig: Path, bus: Bus, unique: str
) -> None:
    body = joined(
        deployment(
            "bounded",
            3,
            annotations={"tideshift.io/min-replicas": "2", "tideshift.io/max-replicas": "5"},
        )
    )
    await asyncio.to_thread(create, admin, collection("Deployment", k8s_namespace), body)
    target = WorkloadRef(k8s_namespace, "Deployment", "bounded")
    async with executor_on(
        bus, executor_kubeconfig, k8s_namespace, unique + "d", dry_run=True
    ) as dry:
        result = await dry.handle(command(target, 9, "d"))
    assert (result.outcome, result.dry_run, result.current) == ("applied", True, 5)
    assert await asyncio.to_thread(replicas_in_apiserver, admin, target) == 3
    async with executor_on(bus, executor_kubeconfig, k8s_namespace, unique) as executor:
        low = await executor.handle(command(target, 0, "low"))
    assert (low.outcome, low.current) == ("applied", 2)


class Killed(BaseException):
    """Stands for the process dying: nothing after it runs (no record, no result, no ack)."""


async def test_an_executor_killed_between_apply_and_ack_does_not_apply_twice(
    admin: KubeHttp,
    k8s_namespace: str,
    executor_kubeconfig: Path,
    bus: Bus,
    nats_server: Any,
    unique: str,
) -> None:
    await asyncio.to_thread(
        create, admin, collection("Deployment", k8s_namespace), joined(deployment("once", 1))
    )
    target = WorkloadRef(k8s_namespace, "Deployment", "once")
    durable = f"exec-{unique}"
    subject = SCALE_COMMAND.filter(namespace=k8s_namespace)
    writes: list[int] = []

    doomed_bus = await Bus.connect(nats_server.url, name="doomed-executor")
    async with executor_on(doomed_bus, executor_kubeconfig, k8s_namespace, unique) as doomed:
        assert isinstance(doomed.port, KubernetesClusterPort)
        real_set_scale = doomed.port.set_scale

        async def apply_then_die(target: WorkloadRef, replicas: int) -> Any:
            await real_set_scale(target, replicas)
            raise Killed

        doomed.port.set_scale = apply_then_die  # type: ignore[method-assign]
        task = asyncio.ensure_future(
            consume(doomed, doomed_bus, durable=durable, subject=subject, ack_wait_seconds=2.0)
        )
        cmd = command(target, 4, "once-1")
        await bus.publish_durable(
            SCALE_COMMAND.at(namespace=k8s_namespace, kind=target.kind, name="once"), cmd
        )
        with pytest.raises(Killed):
            await asyncio.wait_for(task, WAIT)
    await doomed_bus.connection.close()  # gone without acking
    assert await asyncio.to_thread(replicas_in_apiserver, admin, target) == 4

    results: list[Any] = []

    async def collect() -> None:
        async for envelope in bus.subscribe(
            SCALE_RESULT.filter(namespace=k8s_namespace), consumer="t"
        ):
            results.append(envelope.data)

    collector = asyncio.ensure_future(collect())
    async with executor_on(bus, executor_kubeconfig, k8s_namespace, unique) as survivor:
        assert isinstance(survivor.port, KubernetesClusterPort)
        adapter = survivor.port.adapters["Deployment.apps"]
        real_write = adapter.write

        def counting_write(*args: Any) -> None:
            writes.append(1)
            real_write(*args)

        adapter.write = counting_write  # type: ignore[method-assign]
        try:
            consumer = asyncio.ensure_future(
                consume(survivor, bus, durable=durable, subject=subject, ack_wait_seconds=2.0)
            )
            await asyncio.to_thread(wait_until, lambda: results, timeout=WAIT, what="a result")
            consumer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await consumer
        finally:
            adapter.write = real_write  # type: ignore[method-assign]
            collector.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await collector
    assert len(results) == 1, results
    assert results[0].idempotency_key == "once-1" and results[0].outcome == "noop"
    assert writes == []  # the redelivered command wrote nothing
    obj = await asyncio.to_thread(admin.get, f"{collection('Deployment', k8s_namespace)}/once")
    assert obj["spec"]["replicas"] == 4
    info = await bus.js.consumer_info("TIDESHIFT_SCALE", durable)
    assert info.num_ack_pending == 0 and info.num_pending == 0


async def test_the_executor_role_is_denied_everything_else(
    admin: KubeHttp, k8s_namespace: str, executor_kubeconfig: Path
) -> None:
    await asyncio.to_thread(
        create, admin, collection("Deployment", k8s_namespace), joined(deployment("rbac", 1))
    )
    port = await asyncio.to_thread(executor_port, executor_kubeconfig, k8s_namespace)
    base = f"/apis/apps/v1/namespaces/{k8s_namespace}/deployments"
    try:
        # Allowed: what scaling needs.
        await port.set_scale(WorkloadRef(k8s_namespace, "Deployment", "rbac"), 2)
        denied_requests: list[tuple[str, str, Any]] = [
            ("GET", f"/api/v1/namespaces/{k8s_namespace}/secrets", None),
            # Pods and nodes: read, annotate and advertise batch resources, nothing more.
            ("DELETE", f"/api/v1/namespaces/{k8s_namespace}/pods/any", None),
            ("POST", f"/api/v1/namespaces/{k8s_namespace}/pods", {"metadata": {"name": "x"}}),
            ("PATCH", "/api/v1/nodes/kwok-node-0", {"spec": {"unschedulable": True}}),
            ("DELETE", "/api/v1/nodes/kwok-node-0", None),
            ("DELETE", f"{base}/rbac", None),
            # Changing anything but the scale (e.g. the pod template) is not allowed.
            ("PATCH", f"{base}/rbac", {"spec": {"template": {"metadata": {"labels": {"x": "y"}}}}}),
        ]
        for method, path, body in denied_requests:
            with pytest.raises(ApiException) as denied:
                await asyncio.to_thread(
                    port.http.json, method, path, body=body, content_type=MERGE_PATCH
                )
            assert denied.value.status == 403, (method, path)
    finally:
        await port.close()


def test_tideshift_scale_refuses_an_unlabelled_target_before_sending(
    k8s_cluster: Any, admin: KubeHttp, k8s_namespace: str, capsys: pytest.CaptureFixture[str]
) -> None:
    create(admin, collection("Deployment", k8s_namespace), deployment("outsider", 1))
    create(admin, collection("Deployment", k8s_namespace), joined(deployment("member", 1)))
    # No NATS at this address: a command that got past the check could not be sent.
    common = ["-n", k8s_namespace, "--replicas", "3", "--timeout", "2"]
    common += ["--kubeconfig", str(k8s_cluster.kubeconfig), "--nats-url", "nats://127.0.0.1:9"]
    assert scale_cli.main(["deployment/outsider", *common]) == 1
    refused = capsys.readouterr().err
    assert "not managed: Deployment.apps/" in refused and "nothing sent" in refused
    assert scale_cli.main(["deployment/member", *common]) == 1  # checked, then no bus
    assert "not managed" not in capsys.readouterr().err
    assert replicas_in_apiserver(admin, WorkloadRef(k8s_namespace, "Deployment", "outsider")) == 1


def test_aggregated_events_remember_a_bounded_number_of_objects(
    admin: KubeHttp, k8s_namespace: str, executor_kubeconfig: Path
) -> None:
    port = executor_port(executor_kubeconfig, k8s_namespace)
    writer = port.events
    writer.limit = 5
    names = [f"flood-{index}" for index in range(20)]
    for name in names:
        writer.record(WorkloadRef(k8s_namespace, "Deployment", name), "TideshiftRefused", "m")
    assert len(writer._written) == 5
    # The latest is still aggregated; the first was forgotten and gets a new Event.
    writer.record(WorkloadRef(k8s_namespace, "Deployment", names[-1]), "TideshiftRefused", "m")
    writer.record(WorkloadRef(k8s_namespace, "Deployment", names[0]), "TideshiftRefused", "m")
    events = admin.get(f"/api/v1/namespaces/{k8s_namespace}/events")["items"]
    by_name: dict[str, list[int]] = {}
    for event in events:
        by_name.setdefault(event["involvedObject"]["name"], []).append(event["count"])
    assert by_name[names[-1]] == [2]
    assert sorted(by_name[names[0]]) == [1, 1]
    asyncio.run(port.close())
