"""One target's decisions from kept plans, commands and results: repeats fold into one step
that keeps the first plan's reason; commands join plans by id whatever the order they were
kept in; operators' commands stand alone; the step in force at an instant is found."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from tideshift.events import (
    NodeChanged,
    PlanDecided,
    PlannerStatus,
    PodChanged,
    Resources,
    ScaleCommand,
    ScaleResult,
    ServingPolicy,
    TargetDecision,
    TrainingPolicy,
    WorkloadChanged,
    WorkloadRef,
)
from tideshift.events.codec import decode, encode
from tideshift.events.models import Headroom
from tideshift.services.insight import cli
from tideshift.services.insight.core import history, picture

T0 = datetime(2026, 11, 25, 10, 0, tzinfo=UTC)
WEB = WorkloadRef("shop", "Deployment", "web")
API = WorkloadRef("shop", "Deployment", "api")
CTR = WorkloadRef("ml", "Job.batch.volcano.sh", "ctr")
PARTS = Headroom(forecast=240.0, rise=200.0, rise_ratio=1.25, observed=160.0, panic_hold=False)


def plan(seconds: int, current: int, desired: int, reason: str, **more: object) -> PlanDecided:
    items = (
        TargetDecision(target=WEB, current=current, desired=desired, reason=reason, **more),  # type: ignore[arg-type]
        TargetDecision(target=API, current=1, desired=1, reason="other"),
    )
    return PlanDecided(
        plan_id=f"p{seconds}", policy="tideshift", decided_at=T0 + timedelta(seconds=seconds),
        targets=items,
    )  # fmt: skip


def command(
    plan_id: str, desired: int, *, issuer: str = "planner", seconds: int = 0
) -> ScaleCommand:
    return ScaleCommand(
        target=WEB, desired=desired, reason="why", plan_id=plan_id, issuer=issuer,
        issued_at=T0 + timedelta(seconds=seconds), idempotency_key=f"k-{plan_id}",
    )  # fmt: skip


def result(key: str, outcome: str, previous: int, current: int) -> ScaleResult:
    return ScaleResult(
        target=WEB, idempotency_key=key, outcome=outcome, previous=previous, current=current,  # type: ignore[arg-type]
        desired=current, executed_at=T0 + timedelta(seconds=1),
    )  # fmt: skip


def test_repeats_fold_and_keep_the_first_reason_and_sizing() -> None:
    kept = [
        plan(0, 18, 24, "forecast q0.95 at 10:05", headroom=PARTS),
        # results and commands come later through the stream's source: joined by id
        plan(15, 18, 24, "forecast q0.95 at 10:05 again"),
        plan(30, 24, 24, "holding"),
        plan(45, 24, 24, "holding, later words"),
        command("p0", 24),
        result("k-p0", "applied", 18, 24),
    ]
    steps = history.decisions(WEB, kept)
    assert [(s.current, s.desired, s.plans, s.reason) for s in steps] == [
        (18, 24, 2, "forecast q0.95 at 10:05"),
        (24, 24, 2, "holding"),
    ]
    first = steps[0].as_json()
    assert (first["forecast_rps"], first["observed_rps"], first["panic_hold"]) == (
        240.0,
        160.0,
        False,
    )
    assert first["executed"][0]["outcome"] == "applied"
    assert steps[0].executed[0].describe() == "applied 18 -> 24 at 10:00:01"
    assert (steps[1].at, steps[1].last_at) == (
        T0 + timedelta(seconds=30),
        T0 + timedelta(seconds=45),
    )


def test_pins_skips_and_operators_commands_are_shown() -> None:
    kept = [
        plan(0, 5, 9, "pinned at 9 by the operator (sale) until released"),
        plan(10, 9, 9, "cannot size: no forecast", skipped=True),
        command("op-1", 3, issuer="operator", seconds=20),
    ]
    steps = history.decisions(WEB, kept)
    assert [(s.pinned, s.skipped, s.plans) for s in steps] == [
        (True, False, 1),
        (False, True, 1),
        (False, False, 0),
    ]
    assert steps[2].reason == "operator: why" and steps[2].executed[0].describe().startswith(
        "command 3 by operator: no result yet"
    )
    assert history.in_force(steps, T0 + timedelta(seconds=12)) is steps[1]
    assert history.in_force(steps, T0 - timedelta(seconds=1)) is None


def test_a_target_no_plan_names_has_no_steps() -> None:
    assert history.decisions(WorkloadRef("shop", "Deployment", "gone"), [plan(0, 1, 2, "r")]) == []


def test_text_names_the_target_span_sizing_reason_and_executor() -> None:
    kept = [plan(0, 18, 24, "forecast", headroom=PARTS), command("p0", 24), plan(15, 18, 24, "r")]
    text = history.render(WEB, history.decisions(WEB, kept), since=T0)
    assert text.splitlines()[:4] == [
        "Deployment.apps/shop/web: 1 decisions over 2 plans since 2026-11-25 10:00:00Z",
        "10:00:00-10:00:15 x2  18 -> 24  forecast 240.0, observed 160.0, rise 200.0 (x1.25) req/s",
        "    why: forecast",
        "    executor: command 24 by planner: no result yet",
    ]


def test_a_recurring_rise_is_named_with_its_period() -> None:
    recurring = PARTS.model_copy(update={"recurring_period_s": 7200.0})
    steps = history.decisions(WEB, [plan(0, 18, 24, "a rise recurring is due", headroom=recurring)])
    assert steps[0].as_json()["recurring_period_s"] == 7200.0
    text = history.render(WEB, steps, since=T0)
    assert "rise 200.0 (x1.25) req/s, a rise recurring every 120 min" in text
    plain_steps = history.decisions(WEB, [plan(0, 18, 24, "r", headroom=PARTS)])
    plain = history.render(WEB, plain_steps, since=T0)
    assert "recurring" not in plain


def test_picture_sorts_targets_by_role_and_counts_what_nodes_lend() -> None:
    now = T0 + timedelta(minutes=1)
    batch = WorkloadChanged(
        change="added", workload=CTR, role="training", replicas=3, ready_replicas=2,
        requests=Resources(cpu=0.5, memory=2**30), training=TrainingPolicy(batch=True),
        observed_at=T0,
    )  # fmt: skip
    web = WorkloadChanged(
        change="added", workload=WEB, role="serving", replicas=18, ready_replicas=17,
        requests=Resources(cpu=1), serving=ServingPolicy(capacity_rps=10), observed_at=T0,
    )  # fmt: skip
    pods = [
        PodChanged(change="added", namespace="ml", name=f"c{i}", phase=phase, node="n1",
                   owner=CTR, observed_at=T0)
        for i, phase in enumerate(("Running", "Pending", "Succeeded"))
    ]  # fmt: skip
    node = NodeChanged(change="added", name="n1", allocatable=Resources(cpu=8), observed_at=T0)
    kept = picture.Kept(
        plan=plan(0, 18, 24, "forecast", headroom=PARTS),
        lease=picture.Lease("a", now + timedelta(seconds=5)),
        statuses=[PlannerStatus(planner="a", leader=True, mode="normal", at=T0)],
        results={WEB: result("k-p0", "would_scale", 18, 24)},
        workloads=[batch, web],
        nodes=[node],
        pods=pods,
    )
    seen = picture.picture(kept, now)
    assert [row.target for row in seen.serving] == [str(WEB)]
    # api: named by the plan only, not sized on a forecast
    assert [row.target for row in seen.jobs] == [str(CTR), str(API)]
    web_row = seen.serving[0]
    assert (web_row.ready, web_row.replicas, web_row.planned) == (17, 18, 24)
    assert (web_row.demand_rps, web_row.executor) == (160.0, "would_scale 18 -> 24")
    assert seen.jobs[0].why == "not in the latest plan" and seen.jobs[0].batch
    (n1,) = seen.nodes
    assert (n1.batch_pods, n1.lent_cpu, n1.lent_memory_gib) == (2, 1.0, 2.0)
    assert seen.planners[0].age_s == 60.0 and seen.plan_age_s == 60.0
    text = picture.render(seen)
    assert "planner a: leader, normal (announced 60s ago)" in text
    assert "Deployment.apps/shop/web: 17/18 -> 24, demand 160.0, forecast 240.0" in text


def test_the_lease_says_who_leads_whatever_the_last_announcements_said() -> None:
    now = T0 + timedelta(minutes=5)
    said = [
        PlannerStatus(planner="a", leader=True, mode="degraded", reasons=("stale",), at=T0),
        PlannerStatus(planner="c", leader=False, mode="passive", at=T0),
    ]
    kept = picture.Kept(
        plan=None, lease=picture.Lease("b", now + timedelta(seconds=5)), statuses=said,
        results={}, workloads=[], nodes=[], pods=[],
    )  # fmt: skip
    seen = picture.picture(kept, now).planners
    assert [(p.name, p.leader, p.mode, p.age_s) for p in seen] == [
        ("a", False, "degraded", 300.0),
        ("b", True, "unknown", None),
        ("c", False, "passive", 300.0),
    ]
    expired = picture.Kept(
        plan=None, lease=picture.Lease("b", now), statuses=said, results={}, workloads=[],
        nodes=[], pods=[],
    )  # fmt: skip
    shown = picture.picture(expired, now)
    assert not any(p.leader for p in shown.planners)
    assert "no planner leads" in picture.render(shown)


def test_explain_validates_only_the_explained_targets_part_of_each_plan() -> None:
    raw = encode(plan(0, 18, 24, "forecast", headroom=PARTS), source="t", subject="s")
    narrowed = decode(cli._narrowed(raw, WEB)).data
    assert isinstance(narrowed, PlanDecided)
    assert [item.target for item in narrowed.targets] == [WEB]
    assert narrowed.targets[0].headroom == PARTS
    assert cli._narrowed(b"not json", WEB) == b"not json"  # the codec will say what it is


def test_a_lease_value_out_of_range_reads_as_absent_not_as_a_crash() -> None:
    assert cli.LeaseValue.model_validate_json(b'{"holder": "a", "expires_at": 12}').expires == (
        datetime(1970, 1, 1, 0, 0, 12, tzinfo=UTC)
    )
    for bad in (b'{"holder": "a", "expires_at": 1e400}', b'{"holder": "a", "expires_at": -1}'):
        with pytest.raises(ValueError, match="expires_at"):
            cli.LeaseValue.model_validate_json(bad)


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (["--since", "2x"], "--since: expected a duration > 0 such as 90s, 30m, 2h or 1d"),
        (["--since", "99999999d"], "--since: beyond the calendar"),
        (["--at", "0001-01-01T00:00Z"], "--at: beyond the calendar"),
        (["--at", "noon"], "--at: expected an ISO 8601 time such as 2026-11-25T10:00Z"),
        (["--timeout", "0"], "--timeout: expected seconds > 0"),
    ],
)
def test_bad_explain_arguments_exit_2_naming_the_argument(
    argv: list[str], said: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_:
        cli.explain_main(["deploy/web", *argv])
    assert exit_.value.code == 2
    assert capsys.readouterr().err.splitlines()[-1].startswith(f"tideshift explain: error: {said}")
