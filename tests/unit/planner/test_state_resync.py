"""The planner's resync with the watcher's snapshot (`PlannerState.resync_workloads`): a
workload whose deletion was lost goes after two snapshots without it, not one; one the
snapshot adds is announced; static targets stay. Time is an argument: no clock."""

from __future__ import annotations

from datetime import UTC, datetime

from tideshift.events import Resources, ServingPolicy, WorkloadChanged, WorkloadRef
from tideshift.services.planner.core.state import PlannerState
from tideshift.services.planner.settings import PlannerSettings, ServingTarget

NOW = 1_800_000_000.0
WEB = WorkloadRef("shop", "Deployment", "web")
API = WorkloadRef("shop", "Deployment", "api")


def announced(ref: WorkloadRef, observed: float = NOW) -> WorkloadChanged:
    return WorkloadChanged(
        change="added",
        workload=ref,
        role="serving",
        replicas=3,
        requests=Resources(cpu=0.5),
        serving=ServingPolicy(capacity_rps=50),
        observed_at=datetime.fromtimestamp(observed, UTC),
    )


def new_state(*static: WorkloadRef) -> PlannerState:
    serving = [
        ServingTarget(namespace=r.namespace, name=r.name, cpu=1.0, capacity_rps=10.0)
        for r in static
    ]
    config = PlannerSettings(health_port=-1, serving=serving).state_config()
    return PlannerState(config, started_at=NOW)


def planned(state: PlannerState, now: float) -> set[WorkloadRef]:
    return {w.target for w in state.targets({}, now).serving}


def test_a_workload_missing_from_two_snapshots_in_a_row_is_forgotten() -> None:
    state = new_state()
    state.apply_workload(announced(WEB), NOW)
    state.apply_workload(announced(API), NOW)
    state.observed[WEB] = (120.0, NOW)
    held = {API: announced(API)}
    assert not state.resync_workloads(held, NOW + 120)  # once absent: maybe just not written
    assert planned(state, NOW + 120) == {WEB, API}
    assert state.resync_workloads(held, NOW + 240)
    assert planned(state, NOW + 240) == {API}
    assert WEB not in state.book.announced and WEB not in state.known
    assert WEB not in state.observed


def test_an_absence_then_a_presence_starts_the_count_again() -> None:
    state = new_state()
    state.apply_workload(announced(WEB), NOW)
    state.resync_workloads({}, NOW + 120)
    state.resync_workloads({WEB: announced(WEB)}, NOW + 240)
    state.resync_workloads({}, NOW + 360)
    assert planned(state, NOW + 360) == {WEB}
    state.resync_workloads({}, NOW + 480)
    assert planned(state, NOW + 480) == set()


def test_the_snapshot_adds_what_the_live_announcements_lost_and_older_entries_lose() -> None:
    state = new_state()
    assert state.resync_workloads({WEB: announced(WEB)}, NOW)
    assert planned(state, NOW) == {WEB}
    newer = announced(WEB, NOW + 60).model_copy(update={"replicas": 7})
    state.apply_workload(newer, NOW + 60)
    assert not state.resync_workloads({WEB: announced(WEB)}, NOW + 120)
    assert state.known[WEB] == 7


def test_static_targets_are_never_dropped_by_a_resync() -> None:
    state = new_state(WEB)
    state.apply_workload(announced(WEB), NOW)
    for k in range(1, 4):
        state.resync_workloads({}, NOW + 120 * k)
    assert planned(state, NOW + 480) == {WEB}
