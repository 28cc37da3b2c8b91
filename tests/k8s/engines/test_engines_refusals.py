"""A resize the cluster refuses (here an admission policy denies it, as a job controller's
webhook or a platform team's policy may) is reported, not retried for ever and never stops
the executor: a `failed` result naming the refusal, a Warning Event on the job, and the next
command, for another job, carried out by the same loop."""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator, Iterator
from datetime import UTC, datetime
from typing import Any

import pytest

from tests.k8s.engines.engine_objects import (
    PYTORCHJOBS,
    elastic_pytorch_job,
    eventually,
)
from tideshift.events import SCALE_COMMAND, SCALE_RESULT, ScaleCommand, ScaleResult, WorkloadRef
from tideshift.services.cluster.adapters.http import KubeHttp
from tideshift.services.cluster.kubernetes import KubernetesClusterPort
from tideshift.services.common.bus import Bus
from tideshift.services.devcluster.cluster import LocalCluster
from tideshift.services.executor.executor import FAILED_REASON, Executor, RecordStore
from tideshift.services.executor.service import consume

pytestmark = pytest.mark.k8s

WAIT_S = 120.0
POLICIES = "/apis/admissionregistration.k8s.io/v1/validatingadmissionpolicies"
BINDINGS = "/apis/admissionregistration.k8s.io/v1/validatingadmissionpolicybindings"
REFUSAL = "resizing this job is refused by the platform's policy"


@pytest.fixture
def refusing_policy(engine_admin: KubeHttp, engine_namespace: str) -> Iterator[str]:
    """A ValidatingAdmissionPolicy (the API server's own admission, no stand-in) that denies
    any change of a Worker count of the PyTorchJobs labelled `guarded` in this namespace."""
    name = f"refuse-resize-{uuid.uuid4().hex[:6]}"
    workers = "spec.pytorchReplicaSpecs.Worker.replicas"
    policy = {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicy",
        "metadata": {"name": name},
        "spec": {
            "failurePolicy": "Fail",
            "matchConstraints": {
                "resourceRules": [
                    {
                        "apiGroups": ["kubeflow.org"],
                        "apiVersions": ["v1"],
                        "operations": ["UPDATE"],
                        "resources": ["pytorchjobs"],
                    }
                ]
            },
            "matchConditions": [
                {
                    "name": "guarded",
                    "expression": "has(object.metadata.labels) && "
                    "'guarded' in object.metadata.labels",
                }
            ],
            "validations": [
                {"expression": f"object.{workers} == oldObject.{workers}", "message": REFUSAL}
            ],
        },
    }
    binding = {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicyBinding",
        "metadata": {"name": name},
        "spec": {
            "policyName": name,
            "validationActions": ["Deny"],
            "matchResources": {
                "namespaceSelector": {
                    "matchLabels": {"kubernetes.io/metadata.name": engine_namespace}
                }
            },
        },
    }
    engine_admin.json("POST", POLICIES, body=policy)
    engine_admin.json("POST", BINDINGS, body=binding)
    try:
        yield name
    finally:
        for path in (f"{BINDINGS}/{name}", f"{POLICIES}/{name}"):
            with contextlib.suppress(Exception):
                engine_admin.json("DELETE", path)


def refused_now(http: KubeHttp, path: str, workers: int) -> bool:
    """Whether the API server denies a dry-run resize yet (a policy takes a moment to load)."""
    patch = {"spec": {"pytorchReplicaSpecs": {"Worker": {"replicas": workers}}}}
    try:
        http.json(
            "PATCH",
            path,
            query=[("dryRun", "All")],
            body=patch,
            content_type="application/merge-patch+json",
        )
    except Exception as error:
        return REFUSAL in str(error)
    return False


@contextlib.asynccontextmanager
async def executor_loop(
    cluster: LocalCluster, bus: Bus, namespace: str, unique: str
) -> AsyncIterator[list[ScaleResult]]:
    """The executor's real command loop (`consume`) for this namespace, and its results."""
    port = KubernetesClusterPort(cluster.api_client())
    executor = Executor(
        port, RecordStore(await bus.kv(f"refuse_{unique}")), name="refusals", events=port
    )
    results: list[ScaleResult] = []

    async def collect() -> None:
        subject = SCALE_RESULT.filter(namespace=namespace)
        async for envelope in bus.subscribe(subject, consumer=f"results-{unique}"):
            results.append(envelope.data)

    tasks = [
        asyncio.ensure_future(collect()),
        asyncio.ensure_future(
            consume(
                executor,
                bus,
                durable=f"refuse-{unique}",
                subject=SCALE_COMMAND.filter(namespace=namespace),
                max_attempts=2,
                ack_wait_seconds=5.0,
            )
        ),
    ]
    try:
        yield results
    finally:
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await port.close()


async def send(bus: Bus, target: WorkloadRef, desired: int, key: str) -> None:
    command = ScaleCommand(
        target=target,
        desired=desired,
        reason="engines refusal test",
        plan_id=key,
        issued_at=datetime.now(UTC),
        idempotency_key=key,
    )
    subject = SCALE_COMMAND.at(namespace=target.namespace, kind=target.kind, name=target.name)
    await bus.publish_durable(subject, command, msg_id=key)


async def test_a_resize_the_cluster_refuses_is_reported_and_the_loop_goes_on(
    engines_cluster: LocalCluster,
    engine_admin: KubeHttp,
    engine_namespace: str,
    refusing_policy: str,
    bus: Bus,
    unique: str,
) -> None:
    http, ns = engine_admin, engine_namespace
    jobs = PYTORCHJOBS.format(ns=ns)
    for name, labels in (("guarded", {"guarded": "yes"}), ("free", {})):
        body = elastic_pytorch_job(name, workers=2, low=1, high=4)
        body["metadata"].setdefault("labels", {}).update(
            {"tideshift.io/role": "training", **labels}
        )
        await asyncio.to_thread(http.json, "POST", jobs, body=body)
    await asyncio.to_thread(
        eventually,
        lambda: refused_now(http, f"{jobs}/guarded", 3),
        timeout=WAIT_S,
        what=f"the admission policy {refusing_policy} to deny a resize",
    )
    guarded = WorkloadRef(ns, "PyTorchJob.kubeflow.org", "guarded")
    free = WorkloadRef(ns, "PyTorchJob.kubeflow.org", "free")

    def result_for(key: str) -> ScaleResult | None:
        return next((r for r in results if r.idempotency_key == key), None)

    def events_of(name: str) -> list[dict[str, Any]]:
        items = http.get(f"/api/v1/namespaces/{ns}/events")["items"]
        return [
            e
            for e in items
            if e["involvedObject"].get("name") == name and e.get("reason") == FAILED_REASON
        ]

    async with executor_loop(engines_cluster, bus, ns, unique) as results:
        await send(bus, guarded, 3, f"g-{unique}")
        await asyncio.to_thread(
            eventually, lambda: result_for(f"g-{unique}"), timeout=WAIT_S, what="a result"
        )
        refused = result_for(f"g-{unique}")
        assert refused is not None and refused.outcome == "failed", refused
        assert REFUSAL in refused.message
        warnings = await asyncio.to_thread(
            eventually, lambda: events_of("guarded"), timeout=WAIT_S, what="a Warning Event"
        )
        assert warnings[0]["type"] == "Warning" and REFUSAL in warnings[0]["message"]
        spec = (await asyncio.to_thread(http.get, f"{jobs}/guarded"))["spec"]
        assert spec["pytorchReplicaSpecs"]["Worker"]["replicas"] == 2  # nothing written

        # The same loop carries on with the next command.
        await send(bus, free, 3, f"f-{unique}")
        await asyncio.to_thread(
            eventually, lambda: result_for(f"f-{unique}"), timeout=WAIT_S, what="the next result"
        )
        applied = result_for(f"f-{unique}")
        assert applied is not None and (applied.outcome, applied.current) == ("applied", 3)
    # Refused once and reported: not redelivered to be refused again and again.
    assert [r.idempotency_key for r in results].count(f"g-{unique}") == 1
