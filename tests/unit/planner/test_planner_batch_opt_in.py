"""Opting a training job into batch capacity, end to end in the planner: the annotation
`tideshift.io/batch` (or `batch: true` in the planner's settings) -> WorkloadChanged's training
policy -> the planner's targets -> PlanInputs -> a plan on serving's idle reservation, with
the planner's `lend_margin`."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from pydantic import ValidationError

from tideshift.events import (
    ForecastIssued,
    ForecastPoint,
    NodeChanged,
    PodChanged,
    Resources,
    WorkloadRef,
)
from tideshift.services.cluster import port
from tideshift.services.planner.core.baselines import make_policy
from tideshift.services.planner.core.state import PlannerState
from tideshift.services.planner.settings import PlannerSettings, ServingTarget, TrainingTarget
from tideshift.services.watcher.core.annotations import workload_event

GIB = 2**30
NOW = 1_800_000_000.0
WEB = WorkloadRef(kind="Deployment", namespace="shop", name="web")
NIGHTLY = WorkloadRef(kind="PyTorchJob", namespace="ml", name="nightly")


def settings(**overrides: object) -> PlannerSettings:
    """One serving workload of at least three 4-cpu replicas, 100 rps each at full use of its
    request."""
    web = ServingTarget(
        namespace="shop",
        name="web",
        cpu=4.0,
        memory=4 * GIB,
        capacity_rps=100.0,
        min_replicas=3,
        max_replicas=8,
    )
    fields: dict[str, object] = {"batch_grow_after_s": 120.0} | overrides
    return PlannerSettings(serving=[web], health_port=-1, **fields)  # type: ignore[arg-type]


def state_at(now: float, planner_settings: PlannerSettings) -> PlannerState:
    """One 16-cpu node holding serving's three replicas (12 cpu requested) and a flat 100 rps
    forecast issued at `now`: serving stays at three and uses a third of its requests."""
    state = PlannerState(planner_settings.state_config(), started_at=now)
    at = datetime.fromtimestamp(now, tz=UTC)
    state.apply_node(
        NodeChanged(
            change="added",
            name="n1",
            allocatable=Resources(cpu=16.0, memory=64 * GIB),
            observed_at=at,
        ),
        now,
    )
    for index in range(3):
        state.apply_pod(
            PodChanged(
                change="added",
                namespace="shop",
                name=f"web-{index}",
                phase="Running",
                node="n1",
                owner=WEB,
                role="serving",
                requests=Resources(cpu=4.0, memory=4 * GIB),
                observed_at=at,
            ),
            now,
        )
    points = tuple(
        ForecastPoint(
            at=at + timedelta(seconds=60 * k),
            point=100.0,
            q50=100.0,
            q90=100.0,
            q95=100.0,
            q99=100.0,
        )
        for k in range(10)
    )
    state.apply_forecast(
        ForecastIssued(workload=WEB, issued_at=at, step_seconds=60, model="test", points=points),
        now,
    )
    return state


def planned(state: PlannerState, now: float, target: WorkloadRef) -> tuple[int, str]:
    """The target's decision once the room has stayed `batch_grow_after_s` (a first
    plan at `now`, lending nothing yet, then one that long after)."""
    policy = make_policy("tideshift")
    wait = state.config.policy.batch_grow_after_s
    first, policy_state = policy.plan(
        state.inputs(now, state.targets({}, now)), policy.initial_state(), now
    )
    assert [item.desired for item in first.targets if item.target == target] == [0]
    later = now + wait
    decision, _ = policy.plan(state.inputs(later, state.targets({}, later)), policy_state, later)
    (item,) = [item for item in decision.targets if item.target == target]
    return item.desired, item.reason


def nightly_workload(annotations: dict[str, str]) -> port.Workload:
    """A PyTorchJob whose trainers request 1 batch cpu and 1 GiB batch memory, no cpu."""
    return port.Workload(
        ref=NIGHTLY,
        role="training",
        replicas=1,
        ready_replicas=1,
        min_replicas=1,
        max_replicas=40,
        requests=port.Resources(),
        annotations=tuple(sorted(annotations.items())),
        batch_requests=port.Resources(cpu=1.0, memory=GIB),
    )


def test_an_annotated_job_is_planned_on_what_serving_reserves_but_does_not_use() -> None:
    now = NOW
    state = state_at(now, settings())
    at = datetime.fromtimestamp(now, tz=UTC)
    event = workload_event(
        "added", nightly_workload({"tideshift.io/batch": "true"}), observed_at=at
    )
    assert event.training is not None and event.training.batch
    assert (event.requests.cpu, event.requests.memory) == (1.0, GIB)
    state.apply_workload(event, now)
    (job,) = state.inputs(now, state.targets({}, now)).jobs
    assert job.batch and job.trainer_requests == (1.0, GIB, 0.0)
    desired, reason = planned(state, now, NIGHTLY)
    # serving's idle 8 cpu (12 x 2/3), within 16 x (1 - 0.1) - the 4 cpu it uses: 8 trainers
    assert desired == 8
    assert "batch capacity" in reason


def test_the_planners_lend_margin_is_what_it_never_lends() -> None:
    now = NOW
    state = state_at(now, settings(lend_margin=0.5))
    at = datetime.fromtimestamp(now, tz=UTC)
    state.apply_workload(
        workload_event("added", nightly_workload({"tideshift.io/batch": "true"}), observed_at=at),
        now,
    )
    # 16 x (1 - 0.5) - the 4 cpu serving uses = 4
    assert planned(state, now, NIGHTLY)[0] == 4


def test_a_job_in_the_settings_opts_in_with_batch_true() -> None:
    now = NOW
    nightly = TrainingTarget(
        namespace="ml",
        kind="PyTorchJob",
        name="nightly",
        cpu=1.0,
        memory=GIB,
        max_trainers=40,
        batch=True,
    )
    state = state_at(now, settings(training=[nightly]))
    (job,) = state.inputs(now, state.targets({}, now)).jobs
    assert job.batch
    desired, reason = planned(state, now, NIGHTLY)
    assert desired == 8 and "batch capacity" in reason


def test_a_batch_job_in_the_settings_asking_for_gpus_is_refused() -> None:
    with pytest.raises(ValidationError, match="nightly: batch: GPUs are not lent, expected gpu 0"):
        TrainingTarget(namespace="ml", name="nightly", cpu=1.0, gpu=1, max_trainers=4, batch=True)
