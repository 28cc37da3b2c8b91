"""Admitted Kueue jobs with the real Kueue: one with workload slices is resized by the executor
and the pods follow without Kueue evicting it; one Kueue would evict (a PyTorchJob: no slices
in Kueue v0.17) is left to Kueue, and the watcher's view and the executor both say why."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from tests.k8s.engines.engine_objects import (
    CLUSTERQUEUES,
    JOBS,
    LOCALQUEUES,
    PYTORCHJOBS,
    QUEUE_LABEL,
    WORKLOADS,
    batch_job,
    condition,
    elastic_pytorch_job,
    kueue_queues,
    merge_patch,
    pods,
    running_count,
)
from tests.k8s.engines.test_engines_scaling import Commands, executor_on, follow, training
from tideshift.events import WorkloadRef
from tideshift.services.cluster.adapters import kueue_queues as kueue_queues_adapter
from tideshift.services.cluster.adapters.http import KubeHttp
from tideshift.services.cluster.adapters.kueue_queues import evictions
from tideshift.services.cluster.core.conversions import parse_quantity
from tideshift.services.cluster.core.engines import (
    KUEUE_ELASTIC_ANNOTATION,
    KUEUE_ELASTIC_GATE,
    KUEUE_SIZE_PREFIX,
)
from tideshift.services.cluster.core.kueue_quota import (
    LEND_QUOTA_LABEL,
    Amount,
    QuotaConfig,
    QuotaInputs,
)
from tideshift.services.common.bus import Bus
from tideshift.services.devcluster.cluster import LocalCluster
from tideshift.services.executor.kueue_lending import QUOTA_REASON, KueueLender

pytestmark = pytest.mark.k8s


def workloads_of(http: KubeHttp, ns: str, kind: str, name: str) -> list[dict[str, Any]]:
    """Every Workload (each slice of an elastic job) owned by the job."""
    items = http.get(WORKLOADS.format(ns=ns))["items"]
    return [
        w
        for w in items
        if any(
            o["kind"] == kind and o["name"] == name
            for o in w["metadata"].get("ownerReferences", [])
        )
    ]


def never_evicted(http: KubeHttp, ns: str, kind: str, name: str) -> None:
    """No Workload of the job was evicted or deactivated: Kueue kept it admitted throughout."""
    for workload in workloads_of(http, ns, kind, name):
        assert evictions(workload) == 0, workload.get("status")
        assert condition(workload, "Evicted") != "True", workload.get("status")
        assert condition(workload, "Preempted") != "True", workload.get("status")


def admitted(http: KubeHttp, ns: str, kind: str, name: str) -> bool:
    return any(
        condition(w, "Admitted") == "True" and condition(w, "Finished") != "True"
        for w in workloads_of(http, ns, kind, name)
    )


async def test_an_admitted_elastic_job_is_resized_through_workload_slices_without_eviction(
    engines_cluster: LocalCluster,
    engine_admin: KubeHttp,
    engine_namespace: str,
    bus: Bus,
    unique: str,
) -> None:
    http, ns = engine_admin, engine_namespace
    jobs = JOBS.format(ns=ns)
    _, local_queue = kueue_queues(http, ns, name=f"cq-{ns}"[:60], cpu="4")
    body = training(batch_job("elastic", queue=local_queue, parallelism=2, cpu="500m",
                              suspend=None))  # fmt: skip
    body["metadata"]["annotations"] = {KUEUE_ELASTIC_ANNOTATION: "true"}
    del body["spec"]["completions"]  # a work queue: as many pods as parallelism
    created = await asyncio.to_thread(http.json, "POST", jobs, body=body)
    # Kueue's webhook (its feature gate on) gated the pods: the proof Tideshift reads.
    gates = created["spec"]["template"]["spec"].get("schedulingGates", [])
    assert {"name": KUEUE_ELASTIC_GATE} in gates, created["spec"]["template"]["spec"]
    await follow(lambda: running_count(http, ns, "app=elastic") == 2, "Kueue to admit 2 pods")
    first = {p["metadata"]["name"] for p in pods(http, ns, "app=elastic")}
    target = WorkloadRef(ns, "Job.batch", "elastic")

    async with executor_on(engines_cluster, bus, unique) as (executor, port):
        listed = {w.ref: w for w in await port.list_workloads()}
        assert listed[target].held_by == "" and listed[target].replicas == 2
        commands = Commands(executor, target)
        for desired in (4, 1):
            result = await commands.send(desired)
            assert (result.outcome, result.current) == ("applied", desired), result.message
            await follow(
                lambda n=desired: (
                    len(pods(http, ns, "app=elastic")) == n
                    and running_count(http, ns, "app=elastic") == n
                ),
                f"Kueue to admit the new slice and {desired} pods to run",
            )
            if desired == 4:  # grown in place: the first pods kept running
                assert first <= {p["metadata"]["name"] for p in pods(http, ns, "app=elastic")}
            await follow(lambda: admitted(http, ns, "Job", "elastic"), "the slice admitted")
            never_evicted(http, ns, "Job", "elastic")
        job = await asyncio.to_thread(http.get, f"{jobs}/elastic")
        assert job["spec"]["suspend"] is False and job["spec"]["parallelism"] == 1


async def test_an_admitted_pytorchjob_is_left_to_kueue_and_says_why(
    engines_cluster: LocalCluster,
    engine_admin: KubeHttp,
    engine_namespace: str,
    bus: Bus,
    unique: str,
) -> None:
    http, ns = engine_admin, engine_namespace
    jobs = PYTORCHJOBS.format(ns=ns)
    _, local_queue = kueue_queues(http, ns, name=f"cq-{ns}"[:60], cpu="4")
    assert http.get(f"{LOCALQUEUES.format(ns=ns)}/{local_queue}")
    body = training(elastic_pytorch_job("queued", workers=2, low=1, high=4))
    body["metadata"]["labels"][QUEUE_LABEL] = local_queue
    await asyncio.to_thread(http.json, "POST", jobs, body=body)
    selector = "training.kubeflow.org/job-name=queued,training.kubeflow.org/replica-type=worker"
    await follow(
        lambda: (
            admitted(http, ns, "PyTorchJob", "queued") and running_count(http, ns, selector) == 2
        ),
        "Kueue to admit the PyTorchJob and the training operator to run its 2 workers",
    )
    target = WorkloadRef(ns, "PyTorchJob.kubeflow.org", "queued")

    async with executor_on(engines_cluster, bus, unique) as (executor, port):
        listed = {w.ref: w for w in await port.list_workloads()}
        assert listed[target].held_by.startswith(KUEUE_SIZE_PREFIX), listed[target]
        assert "no workload slices for PyTorchJob" in listed[target].held_by
        assert listed[target].replicas == 2 and not listed[target].unscalable
        result = await Commands(executor, target).send(4)
        assert result.outcome == "rejected" and result.message.startswith(KUEUE_SIZE_PREFIX)
    job = await asyncio.to_thread(http.get, f"{jobs}/queued")
    assert job["spec"]["pytorchReplicaSpecs"]["Worker"]["replicas"] == 2
    assert running_count(http, ns, selector) == 2
    never_evicted(http, ns, "PyTorchJob", "queued")


def test_the_lender_reports_bad_queues_and_a_missing_kueue_version_and_goes_on(
    engine_admin: KubeHttp, engine_namespace: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    http, ns = engine_admin, engine_namespace
    good, _ = kueue_queues(http, ns, name=f"good-{ns}"[:60], cpu="1")
    bad, _ = kueue_queues(http, ns, name=f"bad-{ns}"[:60], cpu="1")
    merge_patch(http, f"{CLUSTERQUEUES}/{good}", {"metadata": {"labels": {
        LEND_QUOTA_LABEL: f"{good}-flavor"}}})  # fmt: skip
    merge_patch(http, f"{CLUSTERQUEUES}/{bad}", {"metadata": {"labels": {
        LEND_QUOTA_LABEL: "no-such-flavor"}}})  # fmt: skip
    lender = KueueLender(http, QuotaConfig(min_interval_s=0))
    inputs = QuotaInputs(
        capacity=Amount(8, 32 * 2**30),
        serving_lead=Amount(2, 2**30),
        serving_must=Amount(2, 2**30),
        other=Amount(),
        admitted_minimum=Amount(),
    )
    steps = {step.queue: step for step in lender.step(inputs, now=0.0)}
    # Other tests' labelled queues may be there too: only these two are looked at.
    assert steps[bad].error and "names no flavor" in steps[bad].reason, steps[bad]
    assert not steps[good].error and steps[good].changed, steps[good]
    quota = http.get(f"{CLUSTERQUEUES}/{good}")["spec"]["resourceGroups"][0]["flavors"][0]
    cpu = next(r for r in quota["resources"] if r["name"] == "cpu")["nominalQuota"]
    # 8 - 2 cpu, shared by the labelled queues (other tests' may still be labelled).
    lent = [step for step in steps.values() if not step.error]
    assert float(parse_quantity(str(cpu))) == pytest.approx(6 / len(lent), abs=0.001), quota
    events = http.get(
        "/api/v1/namespaces/default/events",
        query=[("fieldSelector", f"involvedObject.name={bad}")],
    )["items"]
    assert any(e["reason"] == QUOTA_REASON and e["type"] == "Warning" for e in events), events
    for queue in (good, bad):  # not lent to by the tests after this one
        merge_patch(http, f"{CLUSTERQUEUES}/{queue}", {"metadata": {"labels": {
            LEND_QUOTA_LABEL: None}}})  # fmt: skip

    # Kueue of another version (here: a version no Kueue serves): one reason, nothing raised.
    monkeypatch.setattr(
        kueue_queues_adapter, "CLUSTERQUEUES", "/apis/kueue.x-k8s.io/v1alpha9/clusterqueues"
    )
    (step,) = lender.step(inputs, now=1.0)
    assert step.error and "is not served" in step.reason, step
