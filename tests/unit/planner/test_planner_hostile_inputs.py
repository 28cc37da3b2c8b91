"""Valid events at the edge of the contract: times from the future are taken as now, and
names nobody announced cannot grow the planner's state without bound. Time is an argument."""

from __future__ import annotations

from datetime import UTC, datetime

from tideshift.events import (
    DemandObserved,
    ForecastIssued,
    ForecastPoint,
    NodeChanged,
    PodChanged,
    Resources,
    ScaleResult,
    WorkloadChanged,
    WorkloadRef,
)
from tideshift.events.models import ServingPolicy
from tideshift.services.planner.core.baselines import make_policy
from tideshift.services.planner.core.state import (
    DELETED_NODES_LIMIT,
    DELETED_PODS_LIMIT,
    FUTURE_SKEW_S,
    UNTRACKED_LIMIT,
    PlannerState,
)
from tideshift.services.planner.settings import PlannerSettings

NOW = 1_800_000_000.0
WEB = WorkloadRef(kind="Deployment", namespace="shop", name="web")
YEAR_9999 = datetime(9999, 1, 1, tzinfo=UTC)


def at(seconds: float) -> datetime:
    return datetime.fromtimestamp(seconds, tz=UTC)


def new_state() -> PlannerState:
    return PlannerState(PlannerSettings(health_port=-1).state_config(), started_at=NOW)


def observed(rps: float, when: datetime, workload: WorkloadRef = WEB) -> DemandObserved:
    return DemandObserved(workload=workload, rps=rps, observed_at=when)


def forecast(rps: float, issued: float, workload: WorkloadRef = WEB) -> ForecastIssued:
    points = tuple(
        ForecastPoint(at=at(issued + 60 * i), point=rps, q50=rps, q90=rps, q95=rps, q99=rps)
        for i in range(30)
    )
    return ForecastIssued(
        workload=workload, issued_at=at(issued), step_seconds=60, model="flat", points=points
    )


def announce_web(state: PlannerState) -> None:
    state.apply_workload(
        WorkloadChanged(
            change="added",
            workload=WEB,
            role="serving",
            replicas=2,
            requests=Resources(cpu=0.1),
            serving=ServingPolicy(
                capacity_rps=10, min_replicas=1, max_replicas=40, stabilization_seconds=0
            ),
            observed_at=at(NOW),
        ),
        NOW,
    )
    state.apply_node(
        NodeChanged(change="added", name="n1", allocatable=Resources(cpu=64), observed_at=at(NOW)),
        NOW,
    )


def test_demand_stamped_in_year_9999_does_not_pin_serving_at_its_maximum() -> None:
    state = new_state()
    announce_web(state)
    policy = make_policy("tideshift")
    plan_state = policy.initial_state()
    state.apply_forecast(forecast(10.0, NOW), NOW)
    state.apply_observed(observed(1000.0, YEAR_9999), NOW)  # the surge, stamped far ahead
    decision, plan_state = policy.plan(state.inputs(NOW), plan_state, NOW)
    assert decision.desired()[WEB] == 40  # taken as a reading of (about) now: scale up
    desired = 40
    for second in range(10, 50, 10):  # 40 s of true low demand after it
        now = NOW + second
        state.apply_observed(observed(5.0, at(now)), now)
        state.apply_forecast(forecast(10.0, now), now)
        decision, plan_state = policy.plan(state.inputs(now), plan_state, now)
        state.known[WEB] = desired = decision.desired()[WEB]
    assert desired < 40
    assert state.observed_rps(NOW + 40)[WEB] == 5.0


def test_a_forecast_issued_in_the_future_still_ages_into_stale() -> None:
    state = new_state()
    state.apply_forecast(forecast(10.0, YEAR_9999.timestamp()), NOW)
    assert state.forecasts[WEB].issued_at == NOW + FUTURE_SKEW_S


def test_a_node_stamped_in_the_future_is_still_deleted_by_its_real_deletion() -> None:
    state = new_state()
    node = NodeChanged(
        change="added", name="n1", allocatable=Resources(cpu=8), observed_at=YEAR_9999
    )
    state.apply_node(node, NOW)
    gone = node.model_copy(update={"change": "deleted", "observed_at": at(NOW + 10)})
    assert state.apply_node(gone, NOW + 10)
    assert state.table.view().allocatable[0, 0] == 0.0


def test_names_nobody_announced_keep_the_state_bounded() -> None:
    state = new_state()
    announce_web(state)
    state.apply_forecast(forecast(10.0, NOW), NOW)
    for i in range(3 * UNTRACKED_LIMIT):
        stranger = WorkloadRef(kind="Deployment", namespace="x", name=f"w{i}")
        state.apply_forecast(forecast(1.0, NOW, stranger), NOW)
        state.apply_observed(observed(1.0, at(NOW), stranger), NOW)
        result = ScaleResult(
            target=stranger,
            idempotency_key=f"k{i}",
            outcome="applied",
            current=1,
            desired=1,
            executed_at=at(NOW),
        )
        state.apply_result(result, NOW)
    for table in (state.forecasts, state.observed, state.known, state.confirmed):
        assert len(table) <= UNTRACKED_LIMIT + 1
    assert WEB in state.forecasts  # ours are never dropped
    newest = WorkloadRef(kind="Deployment", namespace="x", name=f"w{3 * UNTRACKED_LIMIT - 1}")
    assert newest in state.forecasts  # the newest strangers are kept (an announcement may follow)


def test_deleted_nodes_are_forgotten_beyond_a_limit() -> None:
    state = new_state()
    for i in range(DELETED_NODES_LIMIT + 500):
        state.apply_node(
            NodeChanged(
                change="deleted", name=f"n{i}", allocatable=Resources(), observed_at=at(NOW)
            ),
            NOW,
        )
    assert len(state.node_seen) == DELETED_NODES_LIMIT
    assert len(state.deleted_nodes) == DELETED_NODES_LIMIT


def test_a_deleted_pod_stays_deleted_against_an_older_add_and_tombstones_are_bounded() -> None:
    state = new_state()

    def pod(name: str, change: str, when: float) -> PodChanged:
        return PodChanged(
            change=change,
            namespace="shop",
            name=name,
            phase="Running",
            node="n1",
            requests=Resources(cpu=1.0),
            observed_at=at(when),
        )

    state.apply_pod(pod("p", "added", NOW), NOW)
    state.apply_pod(pod("p", "deleted", NOW + 2), NOW + 2)
    assert not state.apply_pod(pod("p", "modified", NOW + 1), NOW + 3)  # the snapshot, late
    assert len(state.table) == 0
    for i in range(DELETED_PODS_LIMIT + 100):
        state.apply_pod(pod(f"gone-{i}", "deleted", NOW), NOW)
    assert len(state.pod_seen) == len(state.deleted_pods) == DELETED_PODS_LIMIT


def test_the_cluster_table_forgets_deleted_nodes_and_owners_no_pod_has() -> None:
    state = new_state()
    state.apply_node(
        NodeChanged(change="added", name="keep", allocatable=Resources(cpu=8), observed_at=at(NOW)),
        NOW,
    )
    web_pod = PodChanged(
        change="added",
        namespace="shop",
        name="web-0",
        phase="Running",
        node="keep",
        owner=WEB,
        requests=Resources(cpu=1.0),
        observed_at=at(NOW),
    )
    state.apply_pod(web_pod, NOW)
    for i in range(20_000):
        name = f"n{i}"
        for change in ("added", "deleted"):
            node = NodeChanged(
                change=change, name=name, allocatable=Resources(cpu=8), observed_at=at(NOW)
            )
            state.apply_node(node, NOW)
        owner = WorkloadRef(kind="Deployment", namespace="x", name=f"w{i}")
        pod = web_pod.model_copy(update={"name": f"p{i}", "owner": owner, "node": name})
        state.apply_pod(pod, NOW)
        state.apply_pod(pod.model_copy(update={"change": "deleted"}), NOW)
    view = state.table.view()
    assert len(view.node_names) <= 2 * 1024 + 2
    assert len(view.owners) <= 2 * 1024 + 2
    # The live pod still counts on its node, for its owner.
    keep = view.node_names.index("keep")
    assert view.pod_node.tolist() == [keep]
    assert [view.owners[row] for row in view.pod_owner.tolist()] == [WEB]
    assert view.allocatable[keep, 0] == 8.0
