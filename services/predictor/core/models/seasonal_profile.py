"""A seasonal cycle's robust shape: the median over the last cycles, each centred on its own
median, smoothed circularly. Pure numpy; imports nothing of ours but `models.base`."""

from __future__ import annotations

import warnings

import numpy as np

from tideshift.services.predictor.core.models.base import FloatArray, fill_gaps


def robust_profile(
    values: FloatArray, period: int, *, cycles: int, smoothing: float
) -> tuple[int, FloatArray]:
    """Median seasonal shape over the last cycles; returns (anchor index, zero-mean shape)."""
    count = values.shape[0]
    used = max(1, min(cycles, count // period))
    anchor = count - used * period
    block = values[anchor:].reshape(used, period)
    with np.errstate(all="ignore"):
        centred = block - nan_median(block, axis=1)[:, None]
        shape = nan_median(centred, axis=0)
    shape = fill_gaps(shape)
    width = round(smoothing * period)
    if width >= 2:
        kernel = np.ones(width) / width
        padded = np.concatenate([shape[-width:], shape, shape[:width]])
        shape = np.convolve(padded, kernel, mode="same")[width:-width]
    shape = shape - float(np.mean(shape))
    return anchor, shape


def nan_median(block: FloatArray, *, axis: int) -> FloatArray:
    """Median ignoring missing values; all-missing slices give NaN (filled by the caller)."""
    if np.isfinite(block).all():
        result: FloatArray = np.median(block, axis=axis)
        return result
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        median: FloatArray = np.nanmedian(block, axis=axis)
    return median
