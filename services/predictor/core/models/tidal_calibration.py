"""Tidal's calibration on its own out-of-sample errors: the exponentially weighted levels
and the loss that choose the fast rate and reversion, and the conformal quantiles per step
ahead and forecast level. Pure numpy; imports nothing of ours but `models.base`."""

from __future__ import annotations

import numpy as np
from scipy.signal import lfilter

from tideshift.events.models import QUANTILE_LEVELS
from tideshift.services.predictor.core.models.base import FloatArray, StoredArray

NDIntArray = np.ndarray[tuple[int], np.dtype[np.int64]]
NDBoolArray = np.ndarray[tuple[int], np.dtype[np.bool_]]


def ewma(values: FloatArray, rate: float) -> FloatArray:
    """Exponentially weighted level, started at the first value."""
    if rate >= 1.0:
        return values.copy()
    filtered, _ = lfilter([rate], [1.0, rate - 1.0], values, zi=[values[0] * (1.0 - rate)])
    result: FloatArray = np.asarray(filtered, dtype=np.float64)
    return result


def probe_steps(max_steps: int) -> NDIntArray:
    """A handful of steps ahead, log-spaced, that stand in for the whole horizon."""
    probes = np.unique(np.round(np.geomspace(1, max_steps, num=min(max_steps, 8))).astype(np.int64))
    return probes


def level_loss(
    *,
    z: FloatArray,
    seasonal: FloatArray,
    fast: FloatArray,
    slow: FloatArray,
    observed_mask: NDBoolArray,
    origins: NDIntArray,
    steps: NDIntArray,
    reversion: float,
) -> float:
    total, count = 0.0, 0
    for step in steps:
        valid = origins[origins + step < z.shape[0]]
        if valid.shape[0] == 0:
            continue
        targets = valid + step
        predicted = (
            seasonal[targets] + slow[valid] + reversion ** float(step) * (fast[valid] - slow[valid])
        )
        errors = np.abs(z[targets] - predicted)[observed_mask[targets]]
        total += float(errors.sum())
        count += errors.shape[0]
    return total / count if count else 0.0


def left_pad(values: FloatArray, length: int) -> FloatArray:
    if values.shape[0] >= length:
        return values[-length:].copy()
    return np.concatenate([np.full(length - values.shape[0], values[0]), values])


_LEVELS = np.asarray(QUANTILE_LEVELS)


def _sorted_quantiles(ordered: FloatArray) -> FloatArray:
    """QUANTILE_LEVELS of an ascending sample, interpolated linearly (numpy's default)."""
    positions = _LEVELS * (ordered.shape[0] - 1)
    below = np.floor(positions).astype(np.int64)
    above = np.minimum(below + 1, ordered.shape[0] - 1)
    result: FloatArray = ordered[below] + (ordered[above] - ordered[below]) * (positions - below)
    return result


class ErrorRing:
    """The last `capacity` rows of errors and forecasts; unfilled rows are NaN."""

    def __init__(self, *, capacity: int, steps: int) -> None:
        self.errors: StoredArray = np.full((capacity, steps), np.nan, dtype=np.float32)
        self.predicted: StoredArray = np.full((capacity, steps), np.nan, dtype=np.float32)
        self._cursor = 0

    def extend(self, errors: FloatArray, predicted: FloatArray) -> None:
        capacity = self.errors.shape[0]
        errors, predicted = errors[-capacity:], predicted[-capacity:]
        rows = (self._cursor + np.arange(errors.shape[0])) % capacity
        self.errors[rows] = errors
        self.predicted[rows] = predicted
        self._cursor = (self._cursor + errors.shape[0]) % capacity


def calibration_errors(
    *,
    z: FloatArray,
    seasonal: FloatArray,
    fast: FloatArray,
    slow: FloatArray,
    observed_mask: NDBoolArray,
    reversion: float,
    max_steps: int,
    window: int,
) -> tuple[FloatArray, FloatArray]:
    """Errors of step-h forecasts for each recent target, and the forecasts themselves.

    Rows are target intervals, columns steps ahead (1..max_steps).
    """
    count = z.shape[0]
    targets = np.arange(max(1, count - window), count)
    targets = targets[observed_mask[targets]]
    steps = np.arange(1, max_steps + 1)
    origins = targets[:, None] - steps[None, :]
    valid = origins >= 0
    origins = np.maximum(origins, 0)
    predicted = (
        seasonal[targets][:, None]
        + slow[origins]
        + reversion ** steps[None, :].astype(np.float64) * (fast[origins] - slow[origins])
    )
    errors: FloatArray = np.where(valid, z[targets][:, None] - predicted, np.nan)
    return errors, predicted


def spread_by_step(
    errors: StoredArray, predicted: StoredArray, max_steps: int, *, bins: int
) -> tuple[FloatArray, FloatArray]:
    """Error quantiles per forecast-level bin and step ahead (Mondrian conformal).

    Noise is rarely the same at every level (counts in a quiet night are relatively noisier
    than at the daily peak), so errors are pooled by the level that was forecast: `bins`
    equally populated bins over the forecasts in the window. Quantiles are computed at
    log-spaced steps and interpolated between. Returns (inner bin edges, spreads[bin, level,
    step]); a bin with too few errors borrows the pooled quantiles.
    """
    levels = len(QUANTILE_LEVELS)
    if errors.shape[0] == 0:
        return np.zeros(0), np.zeros((1, levels, max_steps))
    # Bin edges from the one-step-ahead forecasts: the same levels, a fraction of the work.
    finite_predictions = predicted[np.isfinite(errors[:, 0]), 0].astype(np.float64)
    edges = (
        np.quantile(finite_predictions, np.linspace(0, 1, bins + 1)[1:-1])
        if bins > 1 and finite_predictions.shape[0]
        else np.zeros(0)
    )
    probes = np.unique(np.round(np.geomspace(1, max_steps, num=min(max_steps, 16))).astype(int))
    at_probes = np.zeros((edges.shape[0] + 1, levels, probes.shape[0]))
    for column, step in enumerate(probes):
        sample = errors[:, step - 1].astype(np.float64)
        finite = np.isfinite(sample)
        sample, forecast = sample[finite], predicted[finite, step - 1].astype(np.float64)
        if not sample.shape[0]:
            continue
        pooled = _sorted_quantiles(np.sort(sample))
        membership = np.searchsorted(edges, forecast)
        # One sort by (bin, error) makes each bin a sorted contiguous run.
        ordered = sample[np.lexsort((sample, membership))]
        ends = np.cumsum(np.bincount(membership, minlength=edges.shape[0] + 1))
        for bin_index in range(edges.shape[0] + 1):
            begin = 0 if bin_index == 0 else int(ends[bin_index - 1])
            in_bin = ordered[begin : int(ends[bin_index])]
            at_probes[bin_index, :, column] = (
                _sorted_quantiles(in_bin) if in_bin.shape[0] >= _MIN_BIN_ERRORS else pooled
            )
    every_step = np.arange(1, max_steps + 1)
    spreads = np.zeros((edges.shape[0] + 1, levels, max_steps))
    for bin_index in range(edges.shape[0] + 1):
        for row in range(levels):
            spreads[bin_index, row] = np.interp(every_step, probes, at_probes[bin_index, row])
    return edges, spreads


# Fewer errors than this cannot place a q0.99 (1 in 100) with any confidence.
_MIN_BIN_ERRORS = 100
