"""Tidal.update: a far-future timestamp is rejected, not applied."""

from __future__ import annotations

import logging

import numpy as np
import pytest

from tideshift.services.predictor.core.models.tidal import Tidal, TidalConfig


def _fitted() -> tuple[Tidal, np.ndarray]:
    times = np.arange(0.0, 3 * 86400.0, 60.0)
    values = 100 + 50 * np.sin(2 * np.pi * times / 86400.0)
    model = Tidal(TidalConfig(max_history_s=7 * 86400.0))
    model.fit(times, values)
    return model, times


def test_far_future_sample_is_rejected_and_later_samples_still_count(
    caplog: pytest.LogCaptureFixture,
) -> None:
    model, times = _fitted()
    last = float(times[-1])
    with caplog.at_level(logging.WARNING):
        model.update(np.array([last + 60.0, 1e15]), np.array([120.0, 5.0]))
    assert model.rejected_future == 1
    assert "rejected 1 sample" in caplog.text
    # The in-range sample was applied; the forecast starts right after it.
    assert model.predict(3).timestamps[0] == pytest.approx(last + 120.0)
    # Later correct samples are not mistaken for old ones.
    model.update(np.array([last + 120.0]), np.array([130.0]))
    assert model.predict(3).timestamps[0] == pytest.approx(last + 180.0)


def test_gap_within_the_history_bound_is_kept_as_missing() -> None:
    model, times = _fitted()
    later = float(times[-1]) + 6 * 3600.0
    model.update(np.array([later]), np.array([90.0]))
    assert model.rejected_future == 0
    forecast = model.predict(2)
    assert forecast.timestamps[0] == pytest.approx(later + 60.0)
    assert np.all(np.isfinite(forecast.quantile(0.95)))
