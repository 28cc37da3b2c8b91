"""The planner's event folding (services/planner/core/state.py): newer observations win, jobs'
helpers are not trainers, executor results set what a target wants, and each event says
whether it calls for a plan now. Time is an argument: no clock."""

from __future__ import annotations

from datetime import UTC, datetime

from tideshift.events import NodeChanged, PodChanged, Resources, ScaleResult, WorkloadRef
from tideshift.services.planner.core.state import PlannerState
from tideshift.services.planner.settings import PlannerSettings, TrainingTarget

NOW = 1_800_000_000.0
JOB = WorkloadRef(kind="PyTorchJob", namespace="ml", name="train")


def at(seconds: float) -> datetime:
    return datetime.fromtimestamp(seconds, tz=UTC)


def new_state(**settings: object) -> PlannerState:
    config = PlannerSettings(health_port=-1, **settings).state_config()  # type: ignore[arg-type]
    return PlannerState(config, started_at=NOW)


def node(cpu: float, observed: float, change: str = "added") -> NodeChanged:
    return NodeChanged(
        change=change,  # type: ignore[arg-type]
        name="n1",
        allocatable=Resources(cpu=cpu),
        observed_at=at(observed),
    )


def pod(name: str, observed: float = NOW) -> PodChanged:
    return PodChanged(
        change="added",
        namespace="ml",
        name=name,
        phase="Running",
        node="n1",
        owner=JOB,
        role="training",
        requests=Resources(cpu=1.0),
        observed_at=at(observed),
    )


def test_an_older_observation_of_a_node_loses_to_a_newer_one() -> None:
    state = new_state()
    assert state.apply_node(node(16.0, NOW + 10), NOW + 11)
    assert not state.apply_node(node(8.0, NOW), NOW + 12)  # e.g. from the snapshot, late
    assert state.table.view().allocatable[0, 0] == 16.0
    assert state.last_cluster_event == NOW + 11


def test_the_cluster_view_goes_stale_after_the_silence_and_fresh_on_the_next_event() -> None:
    state = new_state(cluster_silence_seconds=600.0)
    assert not state.inputs(NOW + 600.0).cluster_stale
    assert state.inputs(NOW + 601.0).cluster_stale
    state.apply_node(node(16.0, NOW + 601.0), NOW + 601.0)
    assert not state.inputs(NOW + 602.0).cluster_stale


def test_a_jobs_pods_named_by_its_markers_are_helpers_not_trainers() -> None:
    job = TrainingTarget(
        namespace="ml", name="train", cpu=1.0, max_trainers=4, companion_markers=("-ps-",)
    )
    state = new_state(training=[job])
    state.apply_node(node(16.0, NOW), NOW)
    assert state.apply_pod(pod("train-ps-0"), NOW)
    assert state.apply_pod(pod("train-worker-0"), NOW)
    view = state.table.view()
    assert sorted(view.pod_replica.tolist()) == [False, True]


def test_executor_results_set_what_a_target_wants_and_a_refusal_forgets_it() -> None:
    state = new_state()

    def result(outcome: str, current: int | None) -> ScaleResult:
        return ScaleResult(
            target=JOB,
            idempotency_key="k",
            outcome=outcome,  # type: ignore[arg-type]
            current=current,
            desired=3,
            executed_at=at(NOW),
        )

    assert not state.apply_result(result("applied", 3), NOW)  # a result plans nothing
    assert state.known[JOB] == 3 and state.confirmed[JOB] == 3
    state.apply_result(result("rejected", None), NOW)
    assert JOB not in state.known and JOB not in state.confirmed


def test_the_settings_tunables_reach_the_policy() -> None:
    state = new_state(miss_tolerance=0.3, lend_margin=0.2)
    config = state.inputs(NOW).config
    assert config.miss_tolerance == 0.3
    assert config.overcommit.margin == 0.2
