"""A compressed day with the real Kueue: serving (a Deployment Kueue does not manage) follows a
day's curve, Kueue admits training Jobs into the quota Tideshift's lender writes, and the lender
takes room back before serving's rise. Each step is a few hours of the day; serving's need over
the lead time is the curve's next step (modelled: the truth as forecast), the quota and what
Kueue does with it are measured.

Used by test_engines_kueue_day.py (a short day in the default suite) and, with
TIDESHIFT_KUEUE_DAY_STEPS / TIDESHIFT_KUEUE_DAY_OUT, to record a longer one that
docs/images/kueue_day.py draws.
"""

from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass, field
from typing import Any

from tests.k8s.engines.engine_objects import (
    CLUSTERQUEUES,
    JOBS,
    LOCALQUEUES,
    RESOURCEFLAVORS,
    WORKLOADS,
    condition,
    container,
    eventually,
    pods,
    running_count,
)
from tideshift.services.cluster.adapters.http import MERGE_PATCH, KubeHttp
from tideshift.services.cluster.adapters.kueue_queues import evictions
from tideshift.services.cluster.core.conversions import parse_quantity
from tideshift.services.cluster.core.kueue_quota import (
    LEND_QUOTA_LABEL,
    Amount,
    QuotaConfig,
    QuotaInputs,
)
from tideshift.services.executor.kueue_lending import KueueLender

GI = 2.0**30
STEP_TIMEOUT_S = 120.0
PRIORITY_LABEL = "kueue.x-k8s.io/priority-class"
KUEUE = "kueue.x-k8s.io/v1beta2"


def serving_curve(steps: int, low: float, high: float) -> list[int]:
    """Serving's replicas over a day of `steps`: a night trough, a morning rise, an evening
    peak (1 cpu each)."""
    out = []
    for i in range(steps):
        hour = 24.0 * i / steps
        rise = 0.5 - 0.5 * math.cos(2 * math.pi * (hour - 4.0) / 24.0)
        out.append(round(low + (high - low) * rise))
    return out


@dataclass
class StepRecord:
    step: int
    hour: float
    serving_now: float  # cores serving runs
    serving_lead: float  # cores serving needs within the lead time
    quota: float  # cpu quota the lender decided
    written: float  # cpu nominalQuota read back from the ClusterQueue
    admitted: float  # cpu of the workloads Kueue admitted, once settled
    training_running: float  # cpu of training pods running
    serving_running: int
    deactivated: list[str] = field(default_factory=list)
    reactivated: list[str] = field(default_factory=list)
    reason: str = ""


@dataclass
class DayResult:
    capacity: float
    steps: list[StepRecord]
    preemptions: int  # workloads deactivated (Kueue evicted them)
    kueue_evictions: int  # evictions Kueue recorded on the Workloads
    lost_pod_hours: float  # training pod-hours lost to those evictions (no checkpoint)
    wall_seconds: float

    def as_json(self) -> dict[str, Any]:
        return asdict(self)


def _post(http: KubeHttp, path: str, body: dict[str, Any]) -> None:
    http.json("POST", path, body=body)


def setup(http: KubeHttp, ns: str, name: str, jobs: int) -> None:
    """A flavor, the lent ClusterQueue (quota 0 until the lender writes it), a LocalQueue, two
    priority classes and `jobs` training Jobs of 2 x 1 cpu each, half of them high priority."""
    flavor = f"{name}-flavor"
    _post(http, RESOURCEFLAVORS, {"apiVersion": KUEUE, "kind": "ResourceFlavor",
                                  "metadata": {"name": flavor}})  # fmt: skip
    queue = {
        "apiVersion": KUEUE,
        "kind": "ClusterQueue",
        "metadata": {"name": name, "labels": {LEND_QUOTA_LABEL: flavor}},
        "spec": {
            "namespaceSelector": {},
            "resourceGroups": [
                {
                    "coveredResources": ["cpu", "memory"],
                    "flavors": [
                        {
                            "name": flavor,
                            "resources": [
                                {"name": "cpu", "nominalQuota": "0"},
                                {"name": "memory", "nominalQuota": "0"},
                            ],
                        }
                    ],
                }
            ],
        },
    }
    _post(http, CLUSTERQUEUES, queue)
    _post(http, LOCALQUEUES.format(ns=ns), {"apiVersion": KUEUE, "kind": "LocalQueue",
          "metadata": {"name": "train"}, "spec": {"clusterQueue": name}})  # fmt: skip
    for level, value in (("low", 0), ("high", 100)):
        _post(http, "/apis/kueue.x-k8s.io/v1beta2/workloadpriorityclasses",
              {"apiVersion": KUEUE, "kind": "WorkloadPriorityClass",
               "metadata": {"name": f"{name}-{level}"}, "value": value})  # fmt: skip
    for i in range(jobs):
        level = "high" if i % 2 == 0 else "low"
        job = {
            "apiVersion": "batch/v1",
            "kind": "Job",
            "metadata": {
                "name": f"train-{i}",
                "labels": {"kueue.x-k8s.io/queue-name": "train", PRIORITY_LABEL: f"{name}-{level}"},
            },
            "spec": {
                "parallelism": 2,
                "suspend": True,
                "template": {
                    "metadata": {"labels": {"app": "train", "job": f"train-{i}"}},
                    "spec": {
                        "containers": [container("main", "1")],
                        "restartPolicy": "Never",
                        "terminationGracePeriodSeconds": 0,
                    },
                },
            },
        }
        _post(http, JOBS.format(ns=ns), job)
    serving = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "web"},
        "spec": {
            "replicas": 0,
            "selector": {"matchLabels": {"app": "web"}},
            "template": {
                "metadata": {"labels": {"app": "web"}},
                "spec": {
                    "containers": [container("web", "1")],
                    "terminationGracePeriodSeconds": 0,
                },
            },
        },
    }
    _post(http, f"/apis/apps/v1/namespaces/{ns}/deployments", serving)


def _cpu_requests(pod: dict[str, Any]) -> float:
    total = 0.0
    for item in pod["spec"].get("containers", []):
        raw = (item.get("resources") or {}).get("requests", {}).get("cpu")
        total += float(parse_quantity(str(raw))) if raw else 0.0
    return total


def cluster_cpu(http: KubeHttp, ns: str) -> tuple[float, float]:
    """(allocatable cpu of the schedulable nodes, cpu requested by pods of other namespaces)."""
    nodes = http.get("/api/v1/nodes")["items"]
    allocatable = sum(
        float(parse_quantity(str(n["status"].get("allocatable", {}).get("cpu", "0"))))
        for n in nodes
        if not n["spec"].get("unschedulable")
    )
    others = [
        p
        for p in http.get("/api/v1/pods")["items"]
        if p["metadata"]["namespace"] != ns
        and p["status"].get("phase") in ("Pending", "Running")
        and not p["metadata"].get("deletionTimestamp")
    ]
    return allocatable, sum(_cpu_requests(p) for p in others)


def _admitted_cpu(http: KubeHttp, ns: str, queue: str) -> float:
    total = 0.0
    for workload in http.get(WORKLOADS.format(ns=ns))["items"]:
        admission = (workload.get("status") or {}).get("admission") or {}
        if admission.get("clusterQueue") != queue or condition(workload, "QuotaReserved") != (
            "True"
        ):
            continue
        for assignment in admission.get("podSetAssignments") or []:
            raw = (assignment.get("resourceUsage") or {}).get("cpu")
            total += float(parse_quantity(str(raw))) if raw else 0.0
    return total


def _pending(http: KubeHttp, ns: str, queue: str) -> int:
    """Active workloads of the queue still waiting for quota."""
    waiting = 0
    for workload in http.get(WORKLOADS.format(ns=ns))["items"]:
        active = (workload.get("spec") or {}).get("active") is not False
        if active and condition(workload, "QuotaReserved") != "True":
            waiting += 1
    return waiting


def written_quota(http: KubeHttp, queue: str) -> float:
    """The cpu nominalQuota the ClusterQueue carries now, as read back."""
    spec = http.get(f"{CLUSTERQUEUES}/{queue}")["spec"]
    resources = spec["resourceGroups"][0]["flavors"][0]["resources"]
    raw = next(r["nominalQuota"] for r in resources if r["name"] == "cpu")
    return float(parse_quantity(str(raw)))


def _training_running(http: KubeHttp, ns: str) -> float:
    return float(running_count(http, ns, "app=train"))


def run_day(
    http: KubeHttp, ns: str, name: str, *, steps: int, jobs: int, config: QuotaConfig
) -> DayResult:
    """The day on a fresh queue `name`, unlabelled afterwards: it outlives the namespace
    (cluster-scoped) and must not be lent to by the tests after this one."""
    setup(http, ns, name, jobs)
    try:
        return _day(http, ns, name, steps=steps, config=config)
    finally:
        http.json(
            "PATCH",
            f"{CLUSTERQUEUES}/{name}",
            body={"metadata": {"labels": {LEND_QUOTA_LABEL: None}}},
            content_type=MERGE_PATCH,
        )


def _day(http: KubeHttp, ns: str, name: str, *, steps: int, config: QuotaConfig) -> DayResult:
    started = time.monotonic()
    allocatable, other = cluster_cpu(http, ns)
    capacity = allocatable - other
    curve = serving_curve(steps, low=0.15 * capacity, high=0.75 * capacity)
    lender = KueueLender(http, config)
    step_hours = 24.0 / steps
    records: list[StepRecord] = []
    admitted_at: dict[str, float] = {}  # workload -> the day's hour it was last admitted
    lost = 0.0
    preemptions = 0
    for i, now_cpu in enumerate(curve):
        hour = i * step_hours
        lead_cpu = max(now_cpu, curve[(i + 1) % steps])  # the lead time: up to the next step
        inputs = QuotaInputs(
            capacity=Amount(capacity, capacity * 4 * GI),
            serving_lead=Amount(lead_cpu, lead_cpu * 64 * 2**20),
            serving_must=Amount(lead_cpu, lead_cpu * 64 * 2**20),
            other=Amount(),
            admitted_minimum=Amount(_admitted_cpu(http, ns, name), 0.0),
        )
        # Training gives room back first (the quota, then Kueue's evictions), then serving
        # takes it: the order Tideshift's lead time buys.
        (result,) = lender.step(inputs, now=hour * 3600.0)
        assert not result.error, result.reason
        quota = result.quota.cpu if result.quota is not None else 0.0
        for gone in result.deactivated:
            preemptions += 1
            since = admitted_at.pop(gone.split("/", 1)[1], hour)
            lost += 2 * (hour - since)  # its 2 pods' work since admission

        def within(q: float = quota) -> bool:
            return (
                _admitted_cpu(http, ns, name) <= q + 1e-6
                and _training_running(http, ns) <= q + 1e-6
            )

        eventually(
            within,
            timeout=STEP_TIMEOUT_S,
            what=f"step {i}: Kueue's admitted training within the quota {quota}",
        )
        http.json(
            "PATCH",
            f"/apis/apps/v1/namespaces/{ns}/deployments/web",
            body={"spec": {"replicas": now_cpu}},
            content_type=MERGE_PATCH,
        )

        def served(n: int = now_cpu) -> bool:
            return running_count(http, ns, "app=web") == n and len(pods(http, ns, "app=web")) == n

        eventually(
            served,
            timeout=STEP_TIMEOUT_S,
            what=f"step {i}: serving's {now_cpu} pods to run (no training pod holding its room)",
        )
        # Kueue admits into what the quota has left; give it a moment to settle (bounded).
        settle_until = time.monotonic() + 3.0
        while time.monotonic() < settle_until:
            if _admitted_cpu(http, ns, name) + 2 > quota or not _pending(http, ns, name):
                break
            time.sleep(0.3)
        admitted_now = _admitted_cpu(http, ns, name)
        for workload in http.get(WORKLOADS.format(ns=ns))["items"]:
            key = workload["metadata"]["name"]
            if condition(workload, "QuotaReserved") == "True":
                admitted_at.setdefault(key, hour)
            else:
                admitted_at.pop(key, None)
        records.append(
            StepRecord(
                step=i,
                hour=hour,
                serving_now=float(now_cpu),
                serving_lead=float(lead_cpu),
                quota=quota,
                written=written_quota(http, name),
                admitted=admitted_now,
                training_running=_training_running(http, ns),
                serving_running=running_count(http, ns, "app=web"),
                deactivated=list(result.deactivated),
                reactivated=list(result.reactivated),
                reason=result.reason,
            )
        )
    kueue_evictions = sum(evictions(w) for w in http.get(WORKLOADS.format(ns=ns))["items"])
    return DayResult(
        capacity=capacity,
        steps=records,
        preemptions=preemptions,
        kueue_evictions=kueue_evictions,
        lost_pod_hours=lost,
        wall_seconds=time.monotonic() - started,
    )
