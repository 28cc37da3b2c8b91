"""A `tideshift simulate` scenario from a live cluster: its schedulable nodes (grouped by
shape), its labelled serving workloads (their annotations' policy, replaying their demand
history from a trace file) and its labelled training jobs (one job each, running throughout).

What the scenario cannot know from the cluster is chosen here and said in the docstring of
each field below: a replica serves `capacity-rps` at its `target-utilization` (the
annotation's meaning), so `capacity-rps / target-utilization` at 100 %; a replica is ready
`lead-time-seconds` after it is bound, training jobs run without parameter servers and never
finish (their work done is compared), and serving keeps the scheduler's priority over
training.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from tideshift.events import WorkloadChanged, WorkloadRef
from tideshift.services.cluster.port import Node
from tideshift.services.simulator.scenario import Scenario, ServingSpec

GIB = 2**30


@dataclass(frozen=True)
class Replay:
    """Where a serving workload's history is: its trace file (relative to the scenario) and
    how far into it the simulated window starts (the part before is the forecaster's history)."""

    path: str
    start_s: float


def node_groups(nodes: Sequence[Node]) -> list[dict[str, Any]]:
    """Schedulable nodes grouped by (cpu, memory, gpu), largest group first."""
    shapes = Counter(
        (node.allocatable.cpu, round(node.allocatable.memory / GIB, 3), node.allocatable.gpu)
        for node in nodes
        if node.schedulable
    )
    return [
        {"count": count, "cpu": cpu, "memory_gib": memory, "gpu": gpu, "name_prefix": f"g{i}"}
        for i, ((cpu, memory, gpu), count) in enumerate(shapes.most_common())
    ]


def serving_spec(workload: WorkloadChanged, name: str, replay: Replay) -> dict[str, Any]:
    policy = workload.serving
    assert policy is not None
    requests = workload.requests
    return {
        "name": name,
        "namespace": workload.workload.namespace,
        "replica": {"cpu": requests.cpu, "memory_gib": requests.memory / GIB, "gpu": requests.gpu},
        # The workload spec as it is (margin, target utilisation and all), under the
        # scenario's names; a replica is ready its lead time after it is bound.
        **ServingSpec.fields_of(policy),
        "startup_delay_s": policy.lead_time_seconds,
        "traffic": {"kind": "trace", "path": replay.path, "start_s": replay.start_s},
    }


def job_spec(workload: WorkloadChanged, name: str) -> dict[str, Any]:
    policy = workload.training
    assert policy is not None
    requests = workload.requests
    most = policy.max_replicas or workload.max_replicas or max(workload.replicas, 1)
    least = min(max(policy.min_replicas, workload.min_replicas, 1), most)
    return {
        "name_prefix": name,
        "namespace": workload.workload.namespace,
        "trainer": {"cpu": requests.cpu, "memory_gib": requests.memory / GIB, "gpu": requests.gpu},
        "min_trainers": least,
        "max_trainers": most,
        "gang_min": min(policy.gang_min, most) if policy.gang_min else None,
        "priority": policy.priority,
        "weight": policy.weight,
        "batch": policy.batch,
    }


def unique_names(refs: Sequence[WorkloadRef]) -> dict[WorkloadRef, str]:
    """Each workload's name; `namespace-name` where two namespaces share a name."""
    counts = Counter(ref.name for ref in refs)
    return {
        ref: ref.name if counts[ref.name] == 1 else f"{ref.namespace}-{ref.name}" for ref in refs
    }


def build_scenario(
    *,
    name: str,
    nodes: Sequence[Node],
    workloads: Sequence[WorkloadChanged],
    replays: Mapping[WorkloadRef, Replay],
    duration_s: float,
    step_s: float,
    history_s: float,
    model: str | None,
) -> Scenario:
    """The scenario: serving workloads without a replay are left out (the caller says why).
    Raises pydantic's ValidationError naming the field for a cluster it cannot express."""
    names = unique_names([w.workload for w in workloads])
    serving = [
        serving_spec(w, names[w.workload], replays[w.workload])
        for w in workloads
        if w.role == "serving" and w.workload in replays
    ]
    jobs = [job_spec(w, names[w.workload]) for w in workloads if w.role == "training"]
    document = {
        "name": name,
        "description": "built by `tideshift whatif` from the live cluster and its history",
        "duration_s": duration_s,
        "step_s": step_s,
        "plan_interval_s": step_s,
        "forecaster": {
            "kind": "model",
            "model": model,
            "interval_s": step_s,
            "history_s": history_s,
        },
        "nodes": node_groups(nodes),
        "serving": serving,
        "training": {"jobs": jobs},
    }
    return Scenario.model_validate(document)
