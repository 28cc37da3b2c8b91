"""Synthetic traffic families: seeded, shaped as named, usable by backtest and simulate."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from tideshift.loadgen.core import families
from tideshift.services.predictor import backtest
from tideshift.services.simulator.scenario import ScenarioError, parse_scenario

DAY = 86400.0


@pytest.mark.parametrize("family", families.family_names())
def test_same_seed_same_counts_other_seed_other_counts(family: str) -> None:
    first = families.generate(family, seed=4, duration_s=3 * DAY, interval_s=300)
    again = families.generate(family, seed=4, duration_s=3 * DAY, interval_s=300)
    other = families.generate(family, seed=5, duration_s=3 * DAY, interval_s=300)
    assert first.counts.shape == (864,)
    np.testing.assert_array_equal(first.counts, again.counts)
    assert not np.array_equal(first.counts, other.counts)
    assert np.all(first.counts >= 0) and np.all(first.counts == np.round(first.counts))


def _acf(values: np.ndarray, lag: int) -> float:
    centred = values - values.mean()
    return float(np.dot(centred[:-lag], centred[lag:]) / np.dot(centred, centred))


def test_daily_family_repeats_every_day_and_flash_crowds_spike() -> None:
    daily = families.generate("daily_drift", seed=1, duration_s=7 * DAY, interval_s=600)
    assert _acf(daily.counts, 144) > 0.5
    peaks = [
        families.generate("flash_crowds", seed=seed, duration_s=14 * DAY, interval_s=600).counts
        for seed in range(8)
    ]
    assert max(float(c.max() / c.mean()) for c in peaks) > 3.0


@pytest.mark.parametrize("seed", range(4))
def test_periodic_spikes_come_back_every_one_to_three_hours_at_three_to_six_x(seed: int) -> None:
    series = families.generate("periodic_spikes", seed=seed, duration_s=2 * DAY, interval_s=60)
    counts = series.counts
    # A spike is a run of minutes well above the rolling base (the hour's median).
    base = np.array([np.median(counts[max(0, i - 30) : i + 30]) for i in range(counts.size)])
    high = counts > 2.5 * base
    starts = np.flatnonzero(high[1:] & ~high[:-1]) + 1
    assert 16 <= starts.size <= 52  # 48 h at one spike every 1-3 h
    heights = [counts[s : s + 2].max() / base[s] for s in starts]
    assert 2.5 < float(np.median(heights)) < 7.5
    # Spikes last minutes, not hours: most minutes are at the base.
    assert high.mean() < 0.15


def test_steep_daily_peaks_sharply_each_day_under_noise() -> None:
    for seed in range(4):
        counts = families.generate(
            "steep_daily", seed=seed, duration_s=4 * DAY, interval_s=600
        ).counts
        assert _acf(counts, 144) > 0.4
        hourly = counts.reshape(-1, 6).mean(axis=1)
        assert hourly.max() / np.median(hourly) > 4.0
        # Noise: neighbouring intervals differ by more than Poisson alone would make them.
        steps = np.abs(np.diff(counts)) / np.sqrt(counts[1:] + 1)
        assert float(np.median(steps)) > 3.0


def test_bursty_low_has_more_spread_than_poisson() -> None:
    counts = families.generate("bursty_low", seed=2, duration_s=7 * DAY, interval_s=60).counts
    assert counts.mean() < 20
    assert counts.var() > 2 * counts.mean()


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"family": "nope", "duration_s": DAY, "interval_s": 60}, "family"),
        ({"family": "weekly", "duration_s": DAY, "interval_s": 0}, "interval_s"),
        ({"family": "weekly", "duration_s": 10, "interval_s": 60}, "duration_s"),
    ],
)
def test_bad_arguments_name_the_field(kwargs: dict[str, object], field: str) -> None:
    with pytest.raises(ValueError, match=field):
        families.generate(seed=0, **kwargs)  # type: ignore[arg-type]


def test_backtest_reads_a_family(capsys: pytest.CaptureFixture[str]) -> None:
    code = backtest.main(
        [
            "--family",
            "level_shifts",
            "--seed",
            "3",
            "--family-days",
            "4",
            "--family-interval",
            "10m",
            "--models",
            "seasonal_naive_daily",
            "--json",
            "--quiet",
        ]
    )
    assert code == 0
    document = json.loads(capsys.readouterr().out)
    assert document["trace"] == "level_shifts#3"
    assert document["models"]["seasonal_naive_daily"]["pinball_q95"] > 0


def test_scenario_family_traffic_has_history_before_zero() -> None:
    scenario = parse_scenario(
        """
duration_s: 3600
nodes: [{count: 1, cpu: 8, memory_gib: 8}]
serving:
  - name: web
    replica: {cpu: 1}
    capacity_rps: 10
    traffic: {kind: family, family: weekly, seed: 2, history_s: 86400, duration_s: 3600}
"""
    )
    profile = scenario.serving[0].traffic.profile(Path("."), None)
    series = families.generate("weekly", seed=2, duration_s=86400 + 3600, interval_s=60)
    assert profile.rate(0.0) == pytest.approx(series.counts[1440] / 60)
    assert profile.rate(-86400.0) == pytest.approx(series.counts[0] / 60)


def test_scenario_unknown_family_names_the_field() -> None:
    with pytest.raises(ScenarioError, match=r"serving\.0\.traffic\.family"):
        parse_scenario(
            """
duration_s: 60
nodes: [{count: 1, cpu: 8, memory_gib: 8}]
serving:
  - {name: web, replica: {cpu: 1}, capacity_rps: 10, traffic: {kind: family, family: x}}
"""
        )
