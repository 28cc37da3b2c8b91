"""Portfolio: Tideshift's default forecaster, a per-workload choice among other models.

No single model wins on every shape: a seasonal profile wins on a regular daily cycle,
persistence with drift in the first minutes of a flash crowd, a smooth statistical model or
Holt-Winters' exponential smoothing on bursty noise without a cycle. The portfolio runs
several members side by side and lets the workload's own history decide, per step ahead:

1. Rolling-origin scoring, out of sample. Every `score_every_s` the members' forecasts are
   recorded; as the actual values arrive each (member, step ahead) gets its squared log
   error, exponentially weighted so old evidence fades (`score_half_life_s`). The first fit
   replays the last `warmup_s` of history (members fitted on what came before) so scores
   exist from the start.
2. Combination. Per step ahead, the `top_members` best members by recent error are combined
   in log space with weights proportional to 1 / error; with too little evidence the first
   member (tidal) forecasts alone. When the evidence changes, the weights follow.
3. Conformal quantiles. The combination's own log errors per step ahead (recent window) give
   its quantiles, and adaptive conformal inference moves each quantile's working level after
   every hit or miss, so q0.95 is exceeded about 5 % of the time on any shape, drifting or
   not. Until enough errors exist, the members' quantiles are combined with the same weights.
4. Selection, in the loss the forecast is judged by. The combination is one candidate
   beside every member's own quantiles; each candidate's pinball loss per level and step
   ahead fades with `selection_half_life_s`, and each quantile is the candidates' weighted
   average with weights falling exponentially with the excess loss over the leader. Pinball
   loss is convex, so the average never scores worse than the weighted candidates. One
   member that clearly leads gets nearly all the weight; near-ties share it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike, NDArray
from pydantic import BaseModel, ConfigDict, Field

from tideshift.events.models import QUANTILE_LEVELS
from tideshift.services.predictor.core.models.base import (
    SECONDS_PER_DAY,
    FloatArray,
    Forecast,
    Forecaster,
    StoredArray,
    make_forecast,
    regularize,
)
from tideshift.services.predictor.core.models.portfolio_errors import SortedErrors

BuildMember = Callable[[str, Mapping[str, object]], Forecaster]

_LEVELS = np.asarray(QUANTILE_LEVELS)
_Q95 = QUANTILE_LEVELS.index(0.95)
_MEDIAN = QUANTILE_LEVELS.index(0.5)
_ABOVE_MEDIAN = _LEVELS > 0.5


class PortfolioConfig(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    # Registry names; the first is the prior (it forecasts alone until scores exist).
    members: tuple[str, ...] = (
        "tidal",
        "drift",
        "seasonal_naive_daily",
        "seasonal_naive_weekly",
        "mstl",
        "auto_theta",
        "holt_winters",
    )
    max_horizon_s: float = Field(default=2 * 3600.0, gt=0)
    score_every_s: float = Field(default=300.0, gt=0)
    score_half_life_s: float = Field(default=2 * SECONDS_PER_DAY, gt=0)
    top_members: int = Field(default=3, ge=1)
    # Scored origins per step ahead before the scores override the prior.
    min_scored: int = Field(default=6, ge=1)
    calibration_window_s: float = Field(default=3 * SECONDS_PER_DAY, gt=0)
    min_calibration: int = Field(default=50, ge=2)
    # Adaptive conformal inference: step of a quantile's working level per hit or miss.
    adaptation_rate: float = Field(default=0.005, ge=0)
    # Selection among the candidates (each member's own quantiles and the combination's),
    # scored by pinball loss per level and step ahead, fading with this half-life.
    selection_half_life_s: float = Field(default=SECONDS_PER_DAY, gt=0)
    # A candidate whose recent loss exceeds the leader's by a fraction x keeps a weight
    # proportional to exp(-selection_sharpness * x): 10 gives a candidate 10 % behind
    # about a third of the leader's weight.
    selection_sharpness: float = Field(default=10.0, ge=0)
    # Three days, so the first scores span more than one kind of day: scored on a weekend
    # alone, yesterday's value looks best and fails on the Monday after.
    warmup_s: float = Field(default=3 * SECONDS_PER_DAY, ge=0)
    warmup_every_s: float = Field(default=7200.0, gt=0)
    # Updates further than this beyond the last observation are rejected (a broken clock).
    max_gap_s: float = Field(default=35 * SECONDS_PER_DAY, gt=0)
    default_interval_s: float = Field(default=60.0, gt=0)


@dataclass
class _Origin:
    """Forecasts issued at one scored origin, waiting for their actual values."""

    index: int
    member_logs: FloatArray  # [member, step]
    combined_log: FloatArray  # [step], the weighted member forecast before calibration
    quantile_logs: FloatArray  # [level, step], the combination's calibrated quantiles
    candidates: FloatArray  # [candidate, level, step]: members' own quantiles, combination


class Portfolio:
    def __init__(
        self,
        config: PortfolioConfig | None = None,
        *,
        name: str = "portfolio",
        build: BuildMember,
    ) -> None:
        self.config = config or PortfolioConfig()
        self.name = name
        self._build = build
        self._members: list[Forecaster] = []
        self._interval = self.config.default_interval_s
        self._anchor = 0.0  # timestamp of index 0
        self._last_index = -1
        self._offset = 1.0
        self._steps = 1
        self._pending: list[_Origin] = []
        self._last_scored = -(10**12)
        self._squared = np.zeros((0, 1))
        self._weight = np.zeros((0, 1))
        self._scored = np.zeros(1, dtype=np.int64)
        self._ring: StoredArray = np.full((1, 1), np.nan, dtype=np.float32)
        self._ring_points: StoredArray = np.full((1, 1), np.nan, dtype=np.float32)
        self._ring_cursor = np.zeros(1, dtype=np.int64)
        self._sorted: SortedErrors | None = None
        self._scores_since_sort = 0
        self._working_levels = np.tile(_LEVELS[:, None], (1, 1))
        self._cache: tuple[int, FloatArray, FloatArray] | None = None
        self._pinball = np.zeros((1, len(QUANTILE_LEVELS), 1))
        self._top_counts = np.zeros(0)
        self.rejected_future = 0

    # ---- setup ---------------------------------------------------------------------------

    def _new_members(self) -> list[Forecaster]:
        settings = {
            "default_interval_s": self._interval,
            "max_horizon_s": self.config.max_horizon_s,
        }
        return [self._build(name, settings) for name in self.config.members]

    def _reset_scores(self) -> None:
        count, steps = len(self.config.members), self._steps
        self._squared = np.zeros((count, steps))
        self._weight = np.zeros((count, steps))
        self._scored = np.zeros(steps, dtype=np.int64)
        rows = max(
            self.config.min_calibration,
            round(self.config.calibration_window_s / self._score_stride_s()),
        )
        self._ring = np.full((rows, steps), np.nan, dtype=np.float32)
        self._ring_points = np.full((rows, steps), np.nan, dtype=np.float32)
        self._ring_cursor = np.zeros(steps, dtype=np.int64)
        self._sorted = None
        self._working_levels = np.tile(_LEVELS[:, None], (1, steps))
        self._pinball = np.zeros((count + 1, len(QUANTILE_LEVELS), steps))
        self._top_counts = np.zeros(count)
        self._pending = []

    def _score_stride_s(self) -> float:
        return max(self.config.score_every_s, self._interval)

    # ---- Forecaster ----------------------------------------------------------------------

    def fit(self, timestamps: ArrayLike, values: ArrayLike) -> None:
        series = regularize(timestamps, values, default_interval_s=self.config.default_interval_s)
        times: FloatArray = series.start_s + series.interval_s * np.arange(
            series.values.shape[0], dtype=np.float64
        )
        observed = series.values
        fresh = not self._members or not math.isclose(series.interval_s, self._interval)
        if fresh:
            self._interval = series.interval_s
            self._anchor = series.start_s
            self._steps = max(1, math.ceil(self.config.max_horizon_s / self._interval))
            positive = observed[np.isfinite(observed) & (observed > 0)]
            self._offset = max(0.1 * float(np.median(positive)) if positive.shape[0] else 1.0, 1e-9)
            self._reset_scores()
            self._last_index = self._index(float(times[0])) - 1
            held_out = min(round(self.config.warmup_s / self._interval), observed.shape[0] // 2)
            if held_out >= 2:
                self._warm_up(times, observed, held_out)
        self._members = self._new_members()
        for member in self._members:
            member.fit(times, observed)
        self._cache = None
        self._absorb(times, observed, stride_s=self.config.score_every_s)

    def _warm_up(self, times: FloatArray, observed: FloatArray, held_out: int) -> None:
        """Score members on the last `held_out` intervals, fitted on what came before."""
        split = observed.shape[0] - held_out
        self._members = self._new_members()
        for member in self._members:
            member.fit(times[:split], observed[:split])
        self._absorb(times[:split], observed[:split], stride_s=self.config.warmup_every_s)
        chunk = max(1, round(self.config.warmup_every_s / self._interval))
        # In the replay, origins are as far apart as the chunks (a few per day keeps the
        # first fit cheap while every step ahead still gets scored).
        for begin in range(split, observed.shape[0], chunk):
            end = begin + chunk
            for member in self._members:
                member.update(times[begin:end], observed[begin:end])
            self._cache = None
            self._absorb(times[begin:end], observed[begin:end], stride_s=self.config.warmup_every_s)

    def _index(self, timestamp: float) -> int:
        return round((timestamp - self._anchor) / self._interval)

    def update(self, timestamps: ArrayLike, values: ArrayLike) -> None:
        if not self._members:
            self.fit(timestamps, values)
            return
        times = np.asarray(timestamps, dtype=np.float64).ravel()
        observed = np.asarray(values, dtype=np.float64).ravel()
        if times.shape != observed.shape:
            raise ValueError(
                f"timestamps ({times.shape[0]}) and values ({observed.shape[0]}) differ"
            )
        last_time = self._anchor + self._last_index * self._interval
        too_far = times > last_time + self.config.max_gap_s
        if too_far.any():
            # Mirrors Tidal: a far-future sample must not make every later sample look old.
            self.rejected_future += int(too_far.sum())
            times, observed = times[~too_far], observed[~too_far]
        newer = np.isfinite(times) & (times > last_time + self._interval / 2)
        if not newer.any():
            return
        times, observed = times[newer], observed[newer]
        for member in self._members:
            member.update(times, observed)
        self._cache = None
        self._absorb(times, observed, stride_s=self.config.score_every_s)

    def _absorb(self, times: FloatArray, observed: FloatArray, *, stride_s: float) -> None:
        """Score pending origins against values newer than the last seen; issue a scored
        origin when `stride_s` has passed since the last one."""
        indices = np.rint((times - self._anchor) / self._interval).astype(np.int64)
        newer = indices > self._last_index
        if not newer.any():
            return
        order = np.argsort(indices[newer], kind="stable")
        indices, observed = indices[newer][order], observed[newer][order]
        actual_logs = np.log(np.where(observed >= 0, observed, np.nan) + self._offset)
        for origin in self._pending:
            steps = indices - origin.index
            usable = (steps >= 1) & (steps <= self._steps) & np.isfinite(actual_logs)
            if usable.any():
                self._score(origin, steps[usable] - 1, actual_logs[usable])
        self._last_index = max(self._last_index, int(indices[-1]))
        self._pending = [o for o in self._pending if o.index + self._steps > self._last_index]
        stride = max(1, round(stride_s / self._interval))
        if self._last_index - self._last_scored >= stride:
            self._last_scored = self._last_index
            member_logs, member_quantiles = self._member_forecasts(self._steps)
            point, quantiles = self._combine(member_logs, member_quantiles)
            candidates = self._candidates(member_quantiles, quantiles)
            self._pending.append(
                _Origin(self._last_index, member_logs, point, quantiles, candidates)
            )

    def _score(self, origin: _Origin, columns: NDArray[np.int64], actual: FloatArray) -> None:
        decay = 0.5 ** (self._score_stride_s() / self.config.score_half_life_s)
        errors = actual[None, :] - origin.member_logs[:, columns]
        self._squared[:, columns] = decay * self._squared[:, columns] + errors**2
        self._weight[:, columns] = decay * self._weight[:, columns] + 1.0
        self._scored[columns] += 1
        combined_errors = actual - origin.combined_log[columns]
        rows = self._ring_cursor[columns] % self._ring.shape[0]
        self._ring[rows, columns] = combined_errors
        self._ring_points[rows, columns] = origin.combined_log[columns]
        self._ring_cursor[columns] += 1
        self._scores_since_sort += 1
        # Pinball loss in the caller's unit, the loss the planner's quantiles are judged by.
        actual_values = np.exp(actual) - self._offset
        shortfall = actual_values[None, None, :] - origin.candidates[:, :, columns]
        levels = _LEVELS[None, :, None]
        fade = 0.5 ** (self._score_stride_s() / self.config.selection_half_life_s)
        self._pinball[:, :, columns] = fade * self._pinball[:, :, columns] + np.maximum(
            levels * shortfall, (levels - 1.0) * shortfall
        )
        # Adaptive conformal inference: a miss raises the working level, a hit lowers it.
        misses = (actual[None, :] > origin.quantile_logs[:, columns]).astype(np.float64)
        self._working_levels[:, columns] = np.clip(
            self._working_levels[:, columns]
            + self.config.adaptation_rate * (misses - (1.0 - _LEVELS[:, None])),
            0.5,
            0.999,
        )

    # ---- combining -----------------------------------------------------------------------

    def _member_forecasts(self, steps: int) -> tuple[FloatArray, FloatArray]:
        """Log point forecasts [member, step] and log quantiles [member, level, step]."""
        if self._cache is not None and self._cache[0] == self._last_index:
            logs, quantiles = self._cache[1], self._cache[2]
            if logs.shape[1] >= steps:
                return logs[:, :steps], quantiles[:, :, :steps]
        wanted = max(steps, self._steps)
        forecasts = [member.predict(wanted) for member in self._members]
        logs = np.log(np.stack([f.point for f in forecasts]) + self._offset)
        quantiles = np.log(
            np.stack([[f.quantile(level) for level in QUANTILE_LEVELS] for f in forecasts])
            + self._offset
        )
        self._cache = (self._last_index, logs, quantiles)
        return logs[:, :steps], quantiles[:, :, :steps]

    def combination_weights(self, steps: int) -> FloatArray:
        """Each member's weight in the combination per step ahead [member, step], from its
        recent squared log errors."""
        count = len(self._members)
        columns = np.minimum(np.arange(steps), self._steps - 1)
        weights = np.zeros((count, steps))
        weights[0] = 1.0  # the prior
        with np.errstate(divide="ignore", invalid="ignore"):
            mse = np.where(self._weight > 0, self._squared / self._weight, np.inf)[:, columns]
        trusted = self._scored[columns] >= self.config.min_scored
        if not trusted.any():
            return weights
        ranked = np.argsort(mse, axis=0, kind="stable")[: self.config.top_members]
        chosen = np.zeros_like(mse, dtype=bool)
        np.put_along_axis(chosen, ranked, True, axis=0)
        inverse = np.where(chosen & np.isfinite(mse), 1.0 / np.maximum(mse, 1e-12), 0.0)
        totals = inverse.sum(axis=0)
        usable = trusted & (totals > 0)
        weights[:, usable] = inverse[:, usable] / totals[usable]
        return weights

    def selection_weights(self, steps: int) -> FloatArray:
        """Each candidate's weight per level and step ahead [candidate, level, step]: the
        members' own quantiles, then the combination's (alone until scores exist)."""
        columns = np.minimum(np.arange(steps), self._steps - 1)
        weights = np.zeros((self._pinball.shape[0], len(QUANTILE_LEVELS), steps))
        weights[-1] = 1.0
        trusted = self._scored[columns] >= self.config.min_scored
        if not trusted.any():
            return weights
        losses = self._pinball[:, :, columns]
        leader = np.maximum(losses.min(axis=0), 1e-12)
        raw = np.exp(-self.config.selection_sharpness * (losses / leader - 1.0))
        weights[:, :, trusted] = (raw / raw.sum(axis=0))[:, :, trusted]
        return weights

    def member_weights(self, steps: int) -> FloatArray:
        """Each member's share of the q0.95 forecast per step ahead [member, step]: its own
        selection weight plus its part of the combination's."""
        selection = self.selection_weights(steps)[:, _Q95]
        shares: FloatArray = selection[:-1] + selection[-1] * self.combination_weights(steps)
        return shares

    def _candidates(self, member_quantiles: FloatArray, combined: FloatArray) -> FloatArray:
        """Candidate quantiles in the caller's unit [candidate, level, step]."""
        logs = np.concatenate([member_quantiles, combined[None]], axis=0)
        values: FloatArray = np.maximum(np.exp(logs) - self._offset, 0.0)
        return values

    def _combine(
        self, member_logs: FloatArray, member_quantiles: FloatArray
    ) -> tuple[FloatArray, FloatArray]:
        """The weighted log point [step] and the calibrated log quantiles [level, step]."""
        steps = member_logs.shape[1]
        weights = self.combination_weights(steps)
        point = np.sum(weights * member_logs, axis=0)
        fallback = np.einsum("ms,mls->ls", weights, member_quantiles)
        columns = np.minimum(np.arange(steps), self._steps - 1)
        spreads, calibrated = self._conformal_spreads(point, columns)
        quantiles = np.where(calibrated[None, :], point[None, :] + spreads, fallback)
        return point, np.maximum.accumulate(quantiles, axis=0)

    def _conformal_spreads(
        self, point: FloatArray, columns: NDArray[np.int64]
    ) -> tuple[FloatArray, NDArray[np.bool_]]:
        """Quantiles of the combination's recent log errors at the working levels, for each
        step's forecast [level, step]; and which steps have enough errors to use them.

        Errors are pooled by the level that was forecast (Mondrian conformal, two bins:
        quiet and busy), since relative noise at a quiet night is larger than at the peak;
        a bin with too few errors borrows the pooled ones.
        """
        if self._sorted is None or self._scores_since_sort >= _RESORT_EVERY:
            self._sorted = SortedErrors.of(self._ring, self._ring_points)
            self._scores_since_sort = 0
        return self._sorted.spreads(
            point,
            columns,
            levels=self._working_levels[:, columns],
            min_calibration=self.config.min_calibration,
        )

    def predict(self, horizon_steps: int) -> Forecast:
        if not self._members:
            raise RuntimeError("predict() before fit()")
        member_logs, member_quantiles = self._member_forecasts(horizon_steps)
        _, combined = self._combine(member_logs, member_quantiles)
        candidates = self._candidates(member_quantiles, combined)
        selected = np.sum(self.selection_weights(horizon_steps) * candidates, axis=0)
        # A member may narrow the upper quantiles down to the combination's median, not
        # below: when a regime turns (the first weekday after a weekend), a member that led
        # on the old one still leads on its fading score for an hour or more, and a
        # forecast under the consensus is where a shortfall comes from.
        selected[_ABOVE_MEDIAN] = np.maximum(selected[_ABOVE_MEDIAN], candidates[-1, _MEDIAN])
        shares = self.member_weights(horizon_steps)
        self._top_counts += np.bincount(np.argmax(shares, axis=0), minlength=shares.shape[0])
        quantiles = {level: selected[index] for index, level in enumerate(QUANTILE_LEVELS)}
        return make_forecast(
            last_timestamp=self._anchor + self._last_index * self._interval,
            interval_s=self._interval,
            point=quantiles[0.5],
            quantiles=quantiles,
        )

    # ---- reporting -----------------------------------------------------------------------

    def choices(self) -> dict[str, object]:
        """What the portfolio has chosen: each member's current share of the q0.95 forecast
        (its own quantiles' weight plus its part of the combination's) at a few steps ahead,
        and the share of forecast steps each member led since it was created."""
        probes = sorted({1, max(1, self._steps // 4), self._steps})
        weights = self.member_weights(self._steps)
        total = float(self._top_counts.sum())
        return {
            "weights_by_step": {
                str(step): {
                    name: round(float(weights[index, step - 1]), 3)
                    for index, name in enumerate(self.config.members)
                }
                for step in probes
            },
            "led_share": {
                name: round(float(self._top_counts[index]) / total, 3) if total else 0.0
                for index, name in enumerate(self.config.members)
            },
        }


# Sorting the error window is the costly part of calibrating: redo it after this many scores.
_RESORT_EVERY = 12
