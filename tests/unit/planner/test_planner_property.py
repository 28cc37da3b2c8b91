"""Properties of every plan, on random clusters: serving never below its forecast need, and
the plan never puts more on a node than the node has."""

from __future__ import annotations

import math

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from tideshift.services.planner.core import (
    ClusterView,
    Forecast,
    NodeSpec,
    PlanInputs,
    PlanState,
    PodSpec,
    ServingWorkload,
    Target,
    TrainingJob,
    plan,
)

GIB = 2**30
SHAPES = [(1.0, GIB, 0.0), (2.0, 4 * GIB, 0.0), (4.0, 8 * GIB, 1.0), (0.5, GIB, 0.0)]


@st.composite
def scenarios(draw: st.DrawFn) -> tuple[PlanInputs, dict[Target, int]]:
    node_count = draw(st.integers(1, 6))
    nodes = [
        NodeSpec(
            f"n{i}",
            (
                float(draw(st.sampled_from([4, 8, 16]))),
                float(draw(st.sampled_from([16, 64]))) * GIB,
                float(draw(st.sampled_from([0, 0, 2, 4]))),
            ),
        )
        for i in range(node_count)
    ]
    serving = tuple(
        ServingWorkload(
            target=Target("prod", "Deployment", f"web{i}"),
            replica_requests=draw(st.sampled_from(SHAPES[:2] + SHAPES[3:])),
            capacity_rps=float(draw(st.integers(5, 50))),
            min_replicas=draw(st.integers(0, 2)),
            max_replicas=draw(st.integers(2, 40)),
            lead_time_s=30.0,
            margin_s=30.0,
        )
        for i in range(draw(st.integers(0, 2)))
    )
    jobs = []
    for i in range(draw(st.integers(0, 3))):
        low = draw(st.integers(1, 4))
        jobs.append(
            TrainingJob(
                target=Target("ml", "PyTorchJob", f"job{i}"),
                trainer_requests=draw(st.sampled_from(SHAPES)),
                min_trainers=low,
                max_trainers=draw(st.integers(low, 30)),
                priority=draw(st.integers(0, 1)),
                weight=float(draw(st.sampled_from([1, 2]))),
                submitted_at=float(i),
            )
        )
    owners: list[tuple[Target | None, tuple[float, float, float]]] = [(None, SHAPES[0])]
    owners += [(w.target, w.replica_requests) for w in serving]
    owners += [(j.target, j.trainer_requests) for j in jobs]
    # Existing pods, bound only where they fit (a real cluster's state).
    free = {node.name: list(node.allocatable) for node in nodes}
    pods = []
    current: dict[Target, int] = {}
    for _ in range(draw(st.integers(0, 40))):
        owner, request = owners[draw(st.integers(0, len(owners) - 1))]
        name = nodes[draw(st.integers(0, node_count - 1))].name
        room = free[name]
        if all(request[r] <= room[r] + 1e-9 for r in range(3)):
            for r in range(3):
                room[r] -= request[r]
            pods.append(PodSpec(request, name, owner))
            if owner is not None:
                current[owner] = current.get(owner, 0) + 1
    forecasts = {}
    for workload in serving:
        values = tuple(float(draw(st.integers(0, 600))) for _ in range(5))
        forecasts[workload.target] = Forecast(0.0, tuple(60.0 * k for k in range(5)), {0.9: values})
    inputs = PlanInputs(
        cluster=ClusterView.build(nodes, pods),
        serving=serving,
        jobs=tuple(jobs),
        forecasts=forecasts,
        current=current,
    )
    return inputs, current


@settings(max_examples=150, deadline=None)
@given(scenarios())
def test_plans_respect_serving_need_and_node_capacity(
    case: tuple[PlanInputs, dict[Target, int]],
) -> None:
    inputs, _ = case
    decision, _ = plan(inputs, PlanState(), 0.0)
    desired = decision.desired()
    for workload in inputs.serving:
        forecast = inputs.forecasts[workload.target]
        window = [
            v
            for t, v in zip(forecast.times, forecast.quantiles[0.9], strict=True)
            if t <= workload.lead_time_s + workload.margin_s
        ]
        need = math.ceil(max(window) / workload.capacity_rps - 1e-9)
        need = min(max(need, workload.min_replicas), workload.max_replicas)
        assert desired[workload.target] >= need
    allocatable = inputs.cluster.allocatable
    assert np.all(decision.node_usage <= allocatable + 1e-6)
    for job in inputs.jobs:
        count = desired[job.target]
        assert count == 0 or job.floor <= count <= job.max_trainers
