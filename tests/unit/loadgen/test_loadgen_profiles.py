"""rate(t) profiles: explicit times, expected rates."""

from __future__ import annotations

import pytest

from tideshift.loadgen.core.profiles import (
    ConstantProfile,
    DiurnalProfile,
    PointsProfile,
    Surge,
    TraceProfile,
    amplitude_for_peak,
    expected_requests,
    hashed_unit,
    smooth_noise,
)

HOUR = 3600.0
DAY = 86_400.0


@pytest.mark.parametrize(
    ("t", "expected"),
    [
        (14 * HOUR, 100.0),  # the peak
        (2 * HOUR, 20.0),  # the trough, 12 h off
        (8 * HOUR, 60.0),  # halfway: the cosine's zero
        (20 * HOUR, 60.0),
        (DAY + 14 * HOUR, 100.0),  # every day
        (-10 * HOUR, 100.0),  # defined before the run (history)
    ],
)
def test_diurnal_shape(t: float, expected: float) -> None:
    profile = DiurnalProfile(peak_rps=100, trough_rps=20, peak_hour=14)
    assert profile.rate(t) == pytest.approx(expected)


def test_diurnal_weekend_dip_applies_on_saturday_and_sunday_only() -> None:
    profile = DiurnalProfile(peak_rps=100, trough_rps=20, weekend_factor=0.5, start_weekday=0)
    friday, saturday, sunday, monday = (d * DAY + 14 * HOUR for d in (4, 5, 6, 7))
    assert profile.rate(friday) == pytest.approx(100)
    assert profile.rate(saturday) == pytest.approx(50)
    assert profile.rate(sunday) == pytest.approx(50)
    assert profile.rate(monday) == pytest.approx(100)


def test_diurnal_noise_is_reproducible_bounded_and_seeded() -> None:
    noisy = DiurnalProfile(peak_rps=100, trough_rps=100, noise=0.1, seed=3)
    again = DiurnalProfile(peak_rps=100, trough_rps=100, noise=0.1, seed=3)
    other = DiurnalProfile(peak_rps=100, trough_rps=100, noise=0.1, seed=4)
    times = [i * 97.0 for i in range(2000)]
    rates = [noisy.rate(t) for t in times]
    assert rates == [again.rate(t) for t in times]
    assert rates != [other.rate(t) for t in times]
    assert all(90 - 1e-9 <= r <= 110 + 1e-9 for r in rates)
    assert max(rates) - min(rates) > 10  # the noise really varies


def test_smooth_noise_is_continuous() -> None:
    # Across a step boundary the value moves only a little for a small change of t.
    step = 300.0
    for boundary in (300.0, 600.0, 3000.0):
        before = smooth_noise(1, boundary - 0.01, step)
        after = smooth_noise(1, boundary + 0.01, step)
        assert abs(before - after) < 1e-3
    assert all(-1 <= hashed_unit(0, i) <= 1 for i in range(1000))


@pytest.mark.parametrize(
    ("t", "expected"),
    [
        (0.0, 10.0),  # before the surge
        (1000.0, 10.0),  # at its start
        (1050.0, 15.0),  # halfway up the 100 s ramp towards x2
        (1100.0, 20.0),  # at its height
        (1500.0, 20.0),
        (1950.0, 15.0),  # halfway down
        (2000.0, 10.0),  # over
    ],
)
def test_surge_multiplies_with_linear_ramps(t: float, expected: float) -> None:
    profile = DiurnalProfile(
        peak_rps=10, trough_rps=10, surges=(Surge(1000, 1000, 2.0, ramp_s=100),)
    )
    assert profile.rate(t) == pytest.approx(expected)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"peak_rps": 10, "trough_rps": 20},
        {"peak_rps": 10, "trough_rps": -1},
        {"peak_rps": 10, "trough_rps": 1, "peak_hour": 24},
        {"peak_rps": 10, "trough_rps": 1, "noise": 2},
        {"peak_rps": 10, "trough_rps": 1, "day_s": 0},
    ],
)
def test_diurnal_rejects_bad_parameters(kwargs: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        DiurnalProfile(**kwargs)  # type: ignore[arg-type]


TRACE = TraceProfile(timestamps=(0.0, 60.0, 120.0), counts=(60.0, 120.0, 0.0), interval_s=60.0)


@pytest.mark.parametrize(
    ("profile", "t", "expected"),
    [
        (TRACE, 0.0, 1.0),  # 60 requests per 60 s
        (TRACE, 59.0, 1.0),
        (TRACE, 60.0, 2.0),
        (TRACE, 150.0, 0.0),
        (TRACE, 180.0, 1.0),  # loops after 180 trace seconds
        (TraceProfile((0.0, 60.0, 120.0), (60.0, 120.0, 0.0), 60.0, loop=False), 500.0, 0.0),
        # compression 60: one profile second is one trace minute; the rate is not multiplied
        (TraceProfile((0.0, 60.0, 120.0), (60.0, 120.0, 0.0), 60.0, compression=60), 1.5, 2.0),
        # amplitude scales the rate
        (TraceProfile((0.0, 60.0, 120.0), (60.0, 120.0, 0.0), 60.0, amplitude=10), 61.0, 20.0),
        # start offset into the trace
        (TraceProfile((0.0, 60.0, 120.0), (60.0, 120.0, 0.0), 60.0, start_s=60), 0.0, 2.0),
    ],
)
def test_trace_replay(profile: TraceProfile, t: float, expected: float) -> None:
    assert profile.rate(t) == pytest.approx(expected)


def test_amplitude_for_peak_maps_the_busiest_row_to_the_peak() -> None:
    amplitude = amplitude_for_peak((60.0, 120.0, 0.0), 60.0, peak_rps=50.0)
    profile = TraceProfile((0.0, 60.0, 120.0), (60.0, 120.0, 0.0), 60.0, amplitude=amplitude)
    assert profile.rate(60.0) == pytest.approx(50.0)
    with pytest.raises(ValueError):
        amplitude_for_peak((0.0, 0.0), 60.0, peak_rps=1.0)


def test_trace_rejects_unordered_rows() -> None:
    with pytest.raises(ValueError):
        TraceProfile((0.0, 0.0), (1.0, 1.0), 60.0)


def test_expected_requests_integrates_the_rate() -> None:
    assert expected_requests(ConstantProfile(5.0), 0.0, 10.0, 1.0) == pytest.approx(50.0)
    day = DiurnalProfile(peak_rps=100, trough_rps=20)
    # The cosine averages to the middle over a whole day.
    assert expected_requests(day, 0.0, DAY, 60.0) == pytest.approx(60.0 * DAY, rel=1e-6)


def test_points_step_linear_and_repeat() -> None:
    stepped = PointsProfile((0.0, 100.0), (10.0, 30.0))
    assert [stepped.rate(t) for t in (-5.0, 0.0, 50.0, 100.0, 500.0)] == [10, 10, 10, 30, 30]
    linear = PointsProfile((0.0, 100.0), (10.0, 30.0), linear=True)
    assert linear.rate(50.0) == pytest.approx(20.0)
    repeating = PointsProfile((0.0, 90.0), (40.0, 20.0), repeat_s=180.0)
    assert [repeating.rate(t) for t in (0.0, 90.0, 180.0, 270.0)] == [40, 20, 40, 20]


@pytest.mark.parametrize(
    ("times", "rates"), [((), ()), ((0.0, 0.0), (1.0, 1.0)), ((0.0,), (-1.0,)), ((0.0,), ())]
)
def test_points_reject_bad_input(times: tuple[float, ...], rates: tuple[float, ...]) -> None:
    with pytest.raises(ValueError):
        PointsProfile(times, rates)
