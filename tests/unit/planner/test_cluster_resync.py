"""The planner's node/pod view healed from the watcher's snapshot
(`PlannerState.resync_cluster`): what the live events lost is added, a lost deletion takes
two reads, a newer live observation beats the snapshot, and a deletion beats an older add.
Time is an argument: no clock."""

from __future__ import annotations

from datetime import UTC, datetime

from tideshift.events import NodeChanged, PodChanged, Resources
from tideshift.services.planner.core.state import PlannerState
from tideshift.services.planner.settings import PlannerSettings

NOW = 1_800_000_000.0


def node(name: str, at: float = NOW, change: str = "added") -> NodeChanged:
    return NodeChanged(
        change=change,
        name=name,
        allocatable=Resources(cpu=8, memory=32e9),
        observed_at=datetime.fromtimestamp(at, UTC),
    )


def pod(name: str, at: float = NOW, change: str = "added") -> PodChanged:
    return PodChanged(
        change=change,
        namespace="shop",
        name=name,
        phase="Running",
        node="n1",
        requests=Resources(cpu=1),
        observed_at=datetime.fromtimestamp(at, UTC),
    )


def new_state() -> PlannerState:
    return PlannerState(PlannerSettings(health_port=-1).state_config(), started_at=NOW)


def pods_in(state: PlannerState) -> int:
    return len(state.inputs(NOW).cluster.pod_node)


def test_the_snapshot_adds_what_the_live_events_lost_and_counts_it() -> None:
    state = new_state()
    state.apply_node(node("n1"), NOW)
    repaired = state.resync_cluster([node("n1"), node("n2")], [pod("a"), pod("b")], NOW, NOW)
    assert repaired == {"node": 1, "pod": 2}
    assert set(state.inputs(NOW).cluster.node_names) == {"n1", "n2"}
    assert pods_in(state) == 2
    # The same snapshot again: nothing was wrong any more.
    assert state.resync_cluster([node("n1"), node("n2")], [pod("a"), pod("b")], NOW, NOW) == {
        "node": 0,
        "pod": 0,
    }


def test_a_pod_missing_from_two_reads_in_a_row_is_deleted_not_after_one() -> None:
    state = new_state()
    state.apply_pod(pod("a"), NOW)
    state.apply_pod(pod("gone"), NOW)
    assert state.resync_cluster([], [pod("a")], NOW + 10, NOW + 20) == {"node": 0, "pod": 0}
    assert pods_in(state) == 2  # once absent: maybe its write had not landed yet
    assert state.resync_cluster([], [pod("a")], NOW + 130, NOW + 140) == {"node": 0, "pod": 1}
    assert pods_in(state) == 1
    assert ("shop", "gone") in state.deleted_pods
    # An add older than that deletion (a late, stale snapshot entry) does not bring it back.
    state.resync_cluster([], [pod("a"), pod("gone", NOW)], NOW + 250, NOW + 260)
    assert pods_in(state) == 1


def test_a_node_missing_from_two_reads_is_deleted() -> None:
    state = new_state()
    state.apply_node(node("n1"), NOW)
    state.apply_node(node("lost"), NOW)
    state.resync_cluster([node("n1")], [], NOW + 10, NOW + 20)
    assert state.resync_cluster([node("n1")], [], NOW + 130, NOW + 140)["node"] == 1
    assert state.inputs(NOW).cluster.allocatable.sum(axis=0)[0] == 8


def test_an_object_seen_live_after_the_first_read_began_stays() -> None:
    state = new_state()
    state.resync_cluster([], [], NOW, NOW)
    state.apply_pod(pod("new", NOW + 5), NOW + 5)  # created after that read began
    state.resync_cluster([], [], NOW + 120, NOW + 121)  # absent once
    state.resync_cluster([], [], NOW + 240, NOW + 241)  # twice: deleted as of NOW + 120
    assert pods_in(state) == 0
    # But a live observation newer than the deletion's stamp brings it back.
    state.apply_pod(pod("new", NOW + 200), NOW + 250)
    assert pods_in(state) == 1


def test_a_snapshot_entry_older_than_the_live_deletion_loses() -> None:
    state = new_state()
    state.apply_pod(pod("a", NOW), NOW)
    state.apply_pod(pod("a", NOW + 30, change="deleted"), NOW + 30)
    assert state.resync_cluster([], [pod("a", NOW)], NOW + 60, NOW + 60)["pod"] == 0
    assert pods_in(state) == 0


def test_a_resync_does_not_make_a_silent_watcher_look_alive() -> None:
    state = new_state()
    silence = state.config.cluster_silence_s
    later = NOW + silence + 1
    state.resync_cluster([node("n1", later)], [pod("a", later)], later, later)
    assert state.inputs(later).cluster_stale
