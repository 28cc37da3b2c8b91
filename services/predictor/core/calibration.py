"""Whether a workload's forecasts can still be trusted: how often the demand that came was at
or below each quantile the predictor had forecast for it.

A forecast's q0.95 should hold about 95 % of the time. Each step's forecast is remembered as
first issued (the longest look-ahead: what the planner's lead time relies on); when the step's
demand arrives it scores a hit for each level it stayed within. Over the last `window_steps`
scored steps, q0.95's share of hits is the workload's coverage. Below `distrust_below` the
forecast is no longer trusted (the planner sizes on observed demand instead); it is trusted
again once coverage is back to `trust_again_at`, so one borderline step does not flap it.

Pure: the caller passes the forecasts it issued and the samples that came.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np

from tideshift.events.models import QUANTILE_LEVELS
from tideshift.services.predictor.core.models.base import FloatArray

JUDGED_LEVEL = 0.95  # the level whose coverage decides trust (the planner's default quantile)


@dataclass(frozen=True)
class CalibrationRules:
    window_steps: int = 120
    min_steps: int = 30
    distrust_below: float = 0.75
    trust_again_at: float = 0.85

    def __post_init__(self) -> None:
        if not 0 < self.min_steps <= self.window_steps:
            raise ValueError(
                f"min_steps must be in (0, window_steps={self.window_steps}], got {self.min_steps}"
            )
        if not 0 <= self.distrust_below <= self.trust_again_at <= 1:
            raise ValueError(
                "expected 0 <= distrust_below <= trust_again_at <= 1, got "
                f"{self.distrust_below} and {self.trust_again_at}"
            )


@dataclass
class Calibration:
    """One workload's recent coverage and whether its forecasts are trusted."""

    step_s: float
    rules: CalibrationRules = field(default_factory=CalibrationRules)
    # step index -> the quantiles first forecast for it, not yet scored.
    expected: dict[int, tuple[float, ...]] = field(default_factory=dict)
    # One row per scored step: whether demand stayed within each level of QUANTILE_LEVELS.
    hits: deque[tuple[bool, ...]] = field(init=False)
    trusted: bool = True

    def __post_init__(self) -> None:
        self.hits = deque(maxlen=self.rules.window_steps)

    def _step(self, at: float) -> int:
        return round(at / self.step_s)

    def record(self, times: FloatArray, quantiles: Mapping[float, FloatArray]) -> None:
        """Remember what a fresh forecast said for each step it covers (first forecast wins)."""
        columns = [quantiles[level] for level in QUANTILE_LEVELS]
        for index, at in enumerate(times):
            self.expected.setdefault(
                self._step(float(at)), tuple(float(column[index]) for column in columns)
            )

    def observe(self, times: FloatArray, values: FloatArray) -> None:
        """Score the steps whose demand arrived; forget forecasts for steps now past."""
        newest: int | None = None
        for at, value in zip(times, values, strict=True):
            step = self._step(float(at))
            newest = step if newest is None else max(newest, step)
            forecast = self.expected.pop(step, None)
            if forecast is not None and np.isfinite(value):
                self.hits.append(tuple(float(value) <= q for q in forecast))
        if newest is not None:  # a step with no sample will not get one later
            self.expected = {s: q for s, q in self.expected.items() if s > newest}

    def coverage(self, level: float = JUDGED_LEVEL) -> float | None:
        """The share of scored steps whose demand stayed within `level`; None until
        `min_steps` have been scored."""
        if len(self.hits) < self.rules.min_steps:
            return None
        column = QUANTILE_LEVELS.index(level)
        return sum(row[column] for row in self.hits) / len(self.hits)

    def judge(self) -> str | None:
        """Update trust from the coverage; `untrusted_reason` after it."""
        coverage = self.coverage()
        if coverage is not None:
            if self.trusted and coverage < self.rules.distrust_below:
                self.trusted = False
            elif not self.trusted and coverage >= self.rules.trust_again_at:
                self.trusted = True
        return self.untrusted_reason()

    def untrusted_reason(self) -> str | None:
        """Why the forecasts are not trusted; None while they are."""
        coverage = self.coverage()
        if self.trusted or coverage is None:
            return None
        return (
            f"q{JUDGED_LEVEL:g} held for {coverage:.0%} of the last {len(self.hits)} steps "
            f"(untrusted below {self.rules.distrust_below:.0%}, "
            f"trusted again at {self.rules.trust_again_at:.0%})"
        )
