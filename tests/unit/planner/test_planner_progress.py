"""Training jobs' progress into the planner's inputs (services/planner/progress.py through
state.py): a finite job's remaining work is set on its TrainingJob; reports that cannot be
used (stamped in the future, gone backwards, for a job the plan does not hold, for a name two
namespaces share) are counted by reason and skipped; a finished or gone job's history goes."""

from __future__ import annotations

import pytest

from tests.unit.planner.progress_support import ignored
from tests.unit.planner.progress_support import progress_report as progress
from tideshift.services.planner.core.state import PlannerState
from tideshift.services.planner.settings import PlannerSettings, TrainingTarget

NOW = 1_800_000_000.0


def new_state(*names: tuple[str, str]) -> PlannerState:
    jobs = [
        TrainingTarget(namespace=namespace, name=name, cpu=1.0, max_trainers=40)
        for namespace, name in names
    ]
    config = PlannerSettings(health_port=-1, training=jobs).state_config()
    return PlannerState(config, started_at=NOW)


def remaining(state: PlannerState, now: float) -> dict[str, float | None]:
    return {job.target.name: job.remaining_work for job in state.inputs(now).jobs}


def test_a_finite_jobs_remaining_work_comes_from_its_progress() -> None:
    state = new_state(("ml", "train"), ("ml", "serve-forever"))
    assert not state.apply_progress(progress("train", NOW, 0), NOW)
    state.apply_progress(progress("train", NOW + 100, 50), NOW + 100)
    state.apply_progress(progress("serve-forever", NOW, 0, epochs=None), NOW)
    state.apply_progress(progress("serve-forever", NOW + 100, 50, epochs=None), NOW + 100)
    got = remaining(state, NOW + 101)
    # 50 shards per 100 s at 10 trainers, 350 left: 700 s at 10 trainers.
    assert got["train"] == pytest.approx(700.0 * 10**0.8)
    assert got["serve-forever"] is None


def test_a_report_stamped_in_the_future_is_counted_and_skipped() -> None:
    state = new_state(("ml", "train"))
    before = ignored("future")
    state.apply_progress(progress("train", NOW, 0), NOW)
    state.apply_progress(progress("train", NOW + 3600, 390), NOW + 100)
    state.apply_progress(progress("train", NOW + 100, 50), NOW + 100)
    assert ignored("future") == before + 1
    assert remaining(state, NOW + 101)["train"] == pytest.approx(700.0 * 10**0.8)


def test_progress_going_backwards_is_counted_and_skipped() -> None:
    state = new_state(("ml", "train"))
    before = ignored("backwards")
    state.apply_progress(progress("train", NOW, 0), NOW)
    state.apply_progress(progress("train", NOW + 100, 150), NOW + 100)
    state.apply_progress(progress("train", NOW + 200, 20), NOW + 200)
    assert ignored("backwards") == before + 1
    assert remaining(state, NOW + 201)["train"] == pytest.approx(250 * 100 * 10**0.8 / 150)


def test_a_job_nobody_announced_is_counted_and_its_history_dropped() -> None:
    state = new_state(("ml", "train"))
    before = ignored("unplanned")
    state.apply_progress(progress("stranger", NOW, 0), NOW)
    assert "stranger" in state.progress.histories
    assert set(remaining(state, NOW + 1)) == {"train"}
    assert ignored("unplanned") == before + 1
    assert "stranger" not in state.progress.histories


def test_a_name_two_namespaces_share_gets_no_estimate() -> None:
    state = new_state(("ml", "train"), ("research", "train"))
    before = ignored("ambiguous")
    state.apply_progress(progress("train", NOW, 0), NOW)
    state.apply_progress(progress("train", NOW + 100, 50), NOW + 100)
    jobs = state.inputs(NOW + 101).jobs
    assert [job.remaining_work for job in jobs] == [None, None]
    assert ignored("ambiguous") == before + 1


def test_a_finished_jobs_history_goes() -> None:
    state = new_state(("ml", "train"))
    state.apply_progress(progress("train", NOW, 0), NOW)
    state.apply_progress(progress("train", NOW + 100, 400, state="finished"), NOW + 100)
    assert state.progress.histories == {}
    assert remaining(state, NOW + 101)["train"] is None
