"""A finite job's remaining work from its progress reports (core/training/remaining.py): the rate is
shards per trainer-effort second, so one measured at 10 trainers is estimated at 40 too; bad
reports are refused with a reason, and jobs of unknown length have no estimate."""

from __future__ import annotations

import pytest

from tideshift.services.planner.core.training.remaining import (
    MAX_REPORTS,
    History,
    Report,
    observe,
    remaining_seconds,
    remaining_work,
)

EXPONENT = 0.8


def report(at: float, done: int, *, trainers: int = 10, epochs: int | None = 4) -> Report:
    # 100 shards per epoch: `done` shards applied since the start.
    return Report(
        at=at,
        epoch=done // 100,
        epochs=epochs,
        shards=100,
        applied_in_epoch=done % 100,
        trainers=trainers,
    )


def history(*reports: Report, now: float = 10_000.0) -> History:
    held = History()
    for item in reports:
        held, refused = observe(held, item, now=now)
        assert refused is None
    return held


def test_remaining_work_is_the_shards_left_at_the_measured_rate() -> None:
    # 50 shards in 100 s at 10 trainers: 350 left take 700 s at 10, i.e. 700 x 10 ** 0.8 at one.
    held = history(report(0.0, 0), report(100.0, 50))
    work = remaining_work(held, speedup_exponent=EXPONENT)
    assert work == pytest.approx(700.0 * 10**EXPONENT)
    assert remaining_seconds(held, 10, speedup_exponent=EXPONENT) == pytest.approx(700.0)
    assert remaining_seconds(held, 40, speedup_exponent=EXPONENT) == pytest.approx(
        700.0 * (10 / 40) ** EXPONENT
    )


def test_each_interval_counts_at_the_trainers_it_ran_with() -> None:
    # 100 s at 10 trainers, then 100 s at 20: effort 100 x (10 ** 0.8 + 20 ** 0.8) for 100 shards.
    held = history(report(0.0, 0), report(100.0, 40, trainers=20), report(200.0, 100))
    effort = 100.0 * (10**EXPONENT + 20**EXPONENT)
    work = remaining_work(held, speedup_exponent=EXPONENT)
    assert work == pytest.approx(300 * effort / 100)


def test_a_job_of_unknown_length_or_not_yet_measured_has_no_estimate() -> None:
    assert (
        remaining_work(
            history(report(0.0, 0, epochs=None), report(100.0, 50, epochs=None)),
            speedup_exponent=EXPONENT,
        )
        is None
    )
    assert remaining_work(history(report(0.0, 10)), speedup_exponent=EXPONENT) is None
    assert remaining_work(History(), speedup_exponent=EXPONENT) is None
    # No shard applied yet: no rate.
    assert (
        remaining_work(history(report(0.0, 10), report(50.0, 10)), speedup_exponent=EXPONENT)
        is None
    )
    # Without trainers the effort is nil.
    assert (
        remaining_work(
            history(report(0.0, 0, trainers=0), report(50.0, 10)), speedup_exponent=EXPONENT
        )
        is None
    )


def test_a_job_that_applied_every_shard_has_nothing_left() -> None:
    held = history(report(0.0, 390), report(10.0, 400))
    assert remaining_work(held, speedup_exponent=EXPONENT) == 0.0


def test_a_barely_moving_job_has_no_estimate() -> None:
    # A shard in 2.5 h, with a million to go: centuries, no estimate.
    held = history(
        report(0.0, 0, trainers=1, epochs=10_000), report(9_000.0, 1, trainers=1, epochs=10_000)
    )
    assert remaining_work(held, speedup_exponent=EXPONENT) is None


@pytest.mark.parametrize(
    ("late", "reason"),
    [
        (report(10_100.0, 60), "future"),
        (report(100.0, 60), "stale"),
        (report(50.0, 60), "stale"),
        (report(150.0, 40), "backwards"),
        (report(150.0, 99), "backwards"),
    ],
)
def test_bad_reports_are_refused_and_leave_the_history_as_it_was(late: Report, reason: str) -> None:
    held = history(report(0.0, 0), report(100.0, 120))
    after, refused = observe(held, late, now=10_000.0)
    assert refused is not None and refused.reason == reason
    assert refused.detail
    assert after == held


def test_a_new_plan_of_epochs_starts_a_new_history() -> None:
    held = history(report(0.0, 0), report(100.0, 50))
    after, refused = observe(held, report(200.0, 10, epochs=8), now=10_000.0)
    assert refused is None
    assert after.reports == (report(200.0, 10, epochs=8),)


def test_the_rate_is_measured_over_the_window_only() -> None:
    held = History()
    # Slow for an hour (a shard per 100 s), then fast (a shard per second) for 30 min.
    for step in range(37):
        held, _ = observe(held, report(step * 100.0, step, epochs=40), now=1e9, window_s=1800.0)
    for step in range(1, 19):
        held, refused = observe(
            held,
            report(3600.0 + step * 100.0, 36 + step * 100, epochs=40),
            now=1e9,
            window_s=1800.0,
        )
        assert refused is None
    # The window's reports and the one before it (which starts its first interval).
    assert [r.at for r in held.reports] == [3500.0 + 100.0 * step for step in range(20)]
    work = remaining_work(held, speedup_exponent=EXPONENT)
    effort = 1900.0 * 10**EXPONENT
    assert work == pytest.approx((4000 - 1836) * effort / (1836 - 35))


def test_a_history_holds_at_most_max_reports() -> None:
    held = History()
    for step in range(3 * MAX_REPORTS):
        # The trainers change at every report: none may be thinned.
        point = report(float(step), step, trainers=10 + step % 2, epochs=40)
        held, _ = observe(held, point, now=1e9, window_s=1e6)
    assert len(held.reports) == MAX_REPORTS
    assert held.reports[-1].at == 3 * MAX_REPORTS - 1


def test_reports_every_two_seconds_are_thinned_to_span_the_window() -> None:
    held = History()
    # A shard every 2 s for an hour at 10 trainers, then two per 2 s at 20 trainers.
    for step in range(1800):
        held, _ = observe(held, report(2.0 * step, step, epochs=100), now=1e9, window_s=1800.0)
    for step in range(1, 301):
        point = report(3598.0 + 2.0 * step, 1799 + 2 * step, trainers=20, epochs=100)
        held, _ = observe(held, point, now=1e9, window_s=1800.0)
    assert len(held.reports) <= MAX_REPORTS
    span = held.reports[-1].at - held.reports[0].at
    assert 1800.0 <= span <= 1800.0 + 2 * 2 * 1800.0 / MAX_REPORTS
    # Exact over the thinned history: the effort of its span, 10 trainers until 3,600 s and
    # 20 after, for the shards applied over it.
    first, done = held.reports[0], 1799 + 600
    effort = (3600.0 - first.at) * 10**EXPONENT + (4198.0 - 3600.0) * 20**EXPONENT
    expected = (10_000 - done) * effort / (done - first.done)
    assert remaining_work(held, speedup_exponent=EXPONENT) == pytest.approx(expected)
