"""Training work, the model `simulate` and the demo share: ready_trainers ** speedup per second
while the job runs, a pause after each change of its trainer set."""

from __future__ import annotations

import pytest

from tideshift.services.simulator.core.training import JobProgress, WorkModel

MODEL = WorkModel(speedup_exponent=0.5, restart_cost_s=10.0)


def test_the_trainer_set_seen_first_is_no_restart() -> None:
    progress = JobProgress()
    progress.advance(0.0, 100.0, ready=4, running=True, model=MODEL)
    assert progress.work == pytest.approx(4**0.5 * 100.0)
    assert progress.started_at == 0.0


def test_a_change_pauses_progress_for_the_restart_cost_from_the_interval_start() -> None:
    progress = JobProgress()
    progress.advance(0.0, 100.0, ready=4, running=True, model=MODEL)
    progress.advance(100.0, 200.0, ready=9, running=True, model=MODEL)
    assert progress.work == pytest.approx(4**0.5 * 100.0 + 9**0.5 * 90.0)
    # an interval shorter than the pause makes nothing
    progress.advance(200.0, 205.0, ready=1, running=True, model=MODEL)
    assert progress.work == pytest.approx(4**0.5 * 100.0 + 9**0.5 * 90.0)


def test_a_job_that_does_not_run_makes_no_progress_and_has_not_started() -> None:
    progress = JobProgress()
    progress.advance(0.0, 50.0, ready=0, running=False, model=MODEL)
    progress.advance(50.0, 100.0, ready=2, running=False, model=MODEL)
    assert progress.work == 0.0
    assert progress.started_at is None
    # it runs from 100 s, but its set changed at 50 s: paused until 60 s, long over
    progress.advance(100.0, 110.0, ready=2, running=True, model=MODEL)
    assert progress.started_at == 100.0
    assert progress.work == pytest.approx(2**0.5 * 10.0)
