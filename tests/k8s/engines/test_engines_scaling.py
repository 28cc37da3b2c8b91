"""Tideshift's executor scales through the real engines: it writes the size a ScaleCommand
asks for (clamped to the engine's own min/max), and the engine's controller makes the pods
follow within FOLLOW_S; a Kueue job that Kueue has not admitted is never scaled."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from tests.k8s.engines.engine_objects import (
    CLUSTERQUEUES,
    JOBS,
    PYTORCHJOBS,
    RAYCLUSTERS,
    batch_job,
    elastic_pytorch_job,
    eventually,
    kueue_queues,
    merge_patch,
    pods,
    ray_cluster,
    running_count,
)
from tideshift.events import ScaleCommand, ScaleResult, WorkloadRef
from tideshift.services.cluster.adapters.http import KubeHttp
from tideshift.services.cluster.core.engines import KUEUE_HOLD_PREFIX, KUEUE_SIZE_PREFIX
from tideshift.services.cluster.kubernetes import KubernetesClusterPort
from tideshift.services.common.bus import Bus
from tideshift.services.devcluster.cluster import LocalCluster
from tideshift.services.executor.executor import Executor, RecordStore

pytestmark = pytest.mark.k8s

# A loaded two-core machine: a controller's pods must follow a write within this many seconds.
FOLLOW_S = 120.0
T0 = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)


@contextlib.asynccontextmanager
async def executor_on(
    cluster: LocalCluster, bus: Bus, unique: str
) -> AsyncIterator[tuple[Executor, KubernetesClusterPort]]:
    port = KubernetesClusterPort(cluster.api_client())
    records = RecordStore(await bus.kv(f"engines_{unique}"))
    try:
        yield Executor(port, records, name="engines-test"), port
    finally:
        await port.close()


class Commands:
    """Commands for one target, each issued a minute after the one before (never stale)."""

    def __init__(self, executor: Executor, target: WorkloadRef) -> None:
        self.executor, self.target, self.sent = executor, target, 0

    async def send(self, desired: int) -> ScaleResult:
        self.sent += 1
        return await self.executor.handle(
            ScaleCommand(
                target=self.target,
                desired=desired,
                reason="engines test",
                plan_id=f"p{self.sent}",
                issued_at=T0 + timedelta(minutes=self.sent),
                idempotency_key=f"k{self.sent}",
            )
        )


def training(body: dict[str, Any]) -> dict[str, Any]:
    body["metadata"].setdefault("labels", {})["tideshift.io/role"] = "training"
    return body


async def follow(check: Any, what: str) -> Any:
    return await asyncio.to_thread(eventually, check, timeout=FOLLOW_S, what=what)


async def resize(
    commands: Commands,
    desired: int,
    written: int,
    workers: Callable[[int], bool],
    engine: str,
    outcome: str = "applied",
) -> None:
    """Sends `desired`, expects `outcome` with `written` as the size, and the engine to run
    that many workers."""
    result = await commands.send(desired)
    assert (result.outcome, result.current) == (outcome, written), result.message
    await follow(
        lambda: workers(written), f"{engine} to run {written} workers after desired={desired}"
    )


async def test_executor_resizes_an_elastic_pytorchjob_and_the_training_operator_follows(
    engines_cluster: LocalCluster,
    engine_admin: KubeHttp,
    engine_namespace: str,
    bus: Bus,
    unique: str,
) -> None:
    http, ns = engine_admin, engine_namespace
    jobs = PYTORCHJOBS.format(ns=ns)
    body = training(elastic_pytorch_job("elastic", workers=2, low=1, high=4))
    await asyncio.to_thread(http.json, "POST", jobs, body=body)
    selector = "training.kubeflow.org/job-name=elastic"
    target = WorkloadRef(ns, "PyTorchJob.kubeflow.org", "elastic")

    def workers(n: int) -> bool:
        return len(pods(http, ns, selector)) == n and running_count(http, ns, selector) == n

    await follow(lambda: workers(2), "the training operator to run the 2 first workers")
    async with executor_on(engines_cluster, bus, unique) as (executor, _):
        commands = Commands(executor, target)
        # (desired, written: clamped to elasticPolicy [1, 4], outcome)
        for desired, written, outcome in ((3, 3, "applied"), (9, 4, "applied"),
                                          (1, 1, "applied"), (0, 1, "noop")):  # fmt: skip
            await resize(commands, desired, written, workers, "the training operator", outcome)
            spec = (await asyncio.to_thread(http.get, f"{jobs}/elastic"))["spec"]
            assert spec["pytorchReplicaSpecs"]["Worker"]["replicas"] == written


async def test_executor_resizes_a_ray_worker_group_naming_the_workers_that_go(
    engines_cluster: LocalCluster,
    engine_admin: KubeHttp,
    engine_namespace: str,
    bus: Bus,
    unique: str,
) -> None:
    http, ns = engine_admin, engine_namespace
    path = f"{RAYCLUSTERS.format(ns=ns)}/ray"
    body = training(ray_cluster("ray", workers=2, low=1, high=5))
    await asyncio.to_thread(http.json, "POST", RAYCLUSTERS.format(ns=ns), body=body)
    selector = "ray.io/cluster=ray,ray.io/node-type=worker"
    target = WorkloadRef(ns, "RayCluster.ray.io", "ray")

    def names() -> set[str]:
        return {pod["metadata"]["name"] for pod in pods(http, ns, selector)}

    def workers(n: int) -> bool:
        return len(names()) == n and running_count(http, ns, selector) == n

    await follow(lambda: workers(2), "KubeRay to run the 2 first workers")
    async with executor_on(engines_cluster, bus, unique) as (executor, port):
        commands = Commands(executor, target)
        state = await port.get_scale(target)
        assert (state.replicas, state.min_replicas, state.max_replicas) == (2, 1, 5)

        await resize(commands, 4, 4, workers, "KubeRay")

        # Shrinking, the adapter names the workers that go (which ones is the pure rule's,
        # tested in tests/unit/cluster/test_cluster_engines.py: on a loaded run kwok can report
        # an older pod not Running, which that rule rightly takes first); KubeRay deletes
        # exactly those.
        before = names()
        result = await commands.send(2)
        assert (result.outcome, result.current) == ("applied", 2), result.message
        group = (await asyncio.to_thread(http.get, path))["spec"]["workerGroupSpecs"][0]
        chosen = set(group["scaleStrategy"]["workersToDelete"])
        assert len(chosen) == 2 and chosen <= before
        await follow(
            lambda: workers(2) and names() == before - chosen, "KubeRay to delete the named 2"
        )

        # Within the group's own bounds: 9 is written as 5, 0 as 1.
        for desired, written in ((9, 5), (0, 1)):
            await resize(commands, desired, written, workers, "KubeRay")


async def test_a_job_kueue_has_not_admitted_is_never_scaled(
    engines_cluster: LocalCluster,
    engine_admin: KubeHttp,
    engine_namespace: str,
    bus: Bus,
    unique: str,
) -> None:
    http, ns = engine_admin, engine_namespace
    jobs = JOBS.format(ns=ns)
    cluster_queue, local_queue = kueue_queues(http, ns, name=f"cq-{ns}"[:60], cpu="1")
    # 2 x 1 CPU over a quota of 1: Kueue's webhook suspends it and it waits unadmitted.
    body = training(batch_job("waits", queue=local_queue, parallelism=2, cpu="1", suspend=None))
    created = await asyncio.to_thread(http.json, "POST", jobs, body=body)
    assert created["spec"]["suspend"] is True
    target = WorkloadRef(ns, "Job.batch", "waits")

    async with executor_on(engines_cluster, bus, unique) as (executor, port):
        commands = Commands(executor, target)
        for desired in (1, 3):
            result = await commands.send(desired)
            assert result.outcome == "rejected"
            assert result.message.startswith(KUEUE_HOLD_PREFIX), result.message
        job = await asyncio.to_thread(http.get, f"{jobs}/waits")
        assert (job["spec"]["parallelism"], job["spec"]["suspend"]) == (2, True)
        assert pods(http, ns, "app=waits") == []
        # The watcher's view says so too: the workload is unscalable, with the reason.
        listed = {w.ref: w for w in await port.list_workloads()}
        assert (listed[target].unscalable or "").startswith(KUEUE_HOLD_PREFIX)

        # Kueue, not Tideshift, decides: with quota for it, Kueue admits it whole and its
        # pods run.
        queue = await asyncio.to_thread(http.get, f"{CLUSTERQUEUES}/{cluster_queue}")
        groups = queue["spec"]["resourceGroups"]
        next(r for r in groups[0]["flavors"][0]["resources"] if r["name"] == "cpu")[
            "nominalQuota"
        ] = "2"
        # A merge patch: Kueue may have changed the object since it was read (its finalizer).
        await asyncio.to_thread(
            merge_patch,
            http,
            f"{CLUSTERQUEUES}/{cluster_queue}",
            {"spec": {"resourceGroups": groups}},
        )
        await follow(
            lambda: running_count(http, ns, "app=waits") == 2,
            "Kueue to admit job waits with 2 CPUs of quota and its 2 pods to run",
        )
        # Admitted without workload slices, its size stays Kueue's (a resize would evict it;
        # test_engines_kueue.py resizes one with them): read, announced held, never scaled.
        listed = {w.ref: w for w in await port.list_workloads()}
        assert (listed[target].replicas, listed[target].unscalable) == (2, "")
        assert listed[target].held_by.startswith(KUEUE_SIZE_PREFIX), listed[target]
        result = await commands.send(3)
        assert result.outcome == "rejected" and result.message.startswith(KUEUE_SIZE_PREFIX)
