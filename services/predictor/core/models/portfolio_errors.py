"""The portfolio's window of its combination's log errors, sorted per step ahead and level
bin, and the conformal spreads read from it. Pure numpy; imports nothing of ours but
`models.base`."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from tideshift.services.predictor.core.models.base import FloatArray, StoredArray


@dataclass(frozen=True)
class SortedErrors:
    """The error window sorted per step: table 0 pools every error, tables 1.. hold the
    errors whose forecast fell in each level bin; unfilled cells (NaN) sort last."""

    edges: FloatArray
    ordered: StoredArray  # [table, row, step]
    counts: NDArray[np.int64]  # [table, step]

    @classmethod
    def of(cls, errors: StoredArray, points: StoredArray) -> SortedErrors:
        finite = np.isfinite(errors)
        edges = (
            np.quantile(points[finite].astype(np.float64), [0.5])
            if finite.any()
            else np.zeros(0, dtype=np.float64)
        )
        membership = np.searchsorted(edges, np.where(finite, points.astype(np.float64), 0.0))
        tables = [errors] + [
            np.where(finite & (membership == index), errors, np.nan)
            for index in range(edges.shape[0] + 1)
        ]
        stacked = np.stack(tables)
        return cls(
            edges=np.asarray(edges, dtype=np.float64),
            ordered=np.sort(stacked, axis=1),
            counts=np.sum(np.isfinite(stacked), axis=1).astype(np.int64),
        )

    def spreads(
        self,
        point: FloatArray,
        columns: NDArray[np.int64],
        *,
        levels: FloatArray,
        min_calibration: int,
    ) -> tuple[FloatArray, NDArray[np.bool_]]:
        """Quantiles at `levels` [level, step] of the errors of forecasts at `point`'s level
        for each step's `columns`, and which steps have `min_calibration` errors to use them
        (a level bin with too few borrows the pooled table)."""
        bins = np.searchsorted(self.edges, point) + 1  # 0 is the pooled table
        counts = self.counts[bins, columns]
        use_pooled = counts < min_calibration
        bins = np.where(use_pooled, 0, bins)
        counts = self.counts[bins, columns]
        calibrated = counts >= min_calibration
        positions = levels * np.maximum(counts - 1, 0)[None, :]
        below = np.floor(positions).astype(np.int64)
        above = np.minimum(below + 1, np.maximum(counts - 1, 0)[None, :])
        low = self.ordered[bins[None, :], below, columns[None, :]]
        high = self.ordered[bins[None, :], above, columns[None, :]]
        spreads = np.where(calibrated[None, :], low + (high - low) * (positions - below), 0.0)
        return spreads, calibrated
