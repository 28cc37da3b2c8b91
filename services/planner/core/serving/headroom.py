"""Serving's headroom, priced rather than remembered: how far the workload's own demand rose
within one start-up time (its lead time), at its priced level (serving/price.py), from a
bounded window of its recent observations (a split-conformal quantile: each finished lead time
is one calibration score). Replicas ordered now are ready one lead time later; until then the
replicas already there carry whatever demand does.

Rises that come back on a schedule (a batch run every two hours, a cron's burst) are rare
among the scores, so the quantile over all of them misses every one: the large rises
(onsets) are kept apart, and when they recur with a period, the rise they bring is held only
around the time the next one is due, and released once it came. Pure; time is an argument."""

from __future__ import annotations

import bisect
import itertools
import math
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from tideshift.services.planner.core.model import PolicyConfig, Rises, ServingWorkload

# A rise within one lead time is an onset when it is at least this large and beyond the
# workload's usual rises (their q0.99): noise does not come back on a schedule.
ONSET_MIN_RATIO = 2.0
ONSET_USUAL_QUANTILE = 0.99
# A schedule needs this many onsets in the window (three gaps) ...
MIN_ONSETS = 4
# ... most gaps (three in four) a whole number of periods apart, within this share of the
# period, and every onset this close to the schedule fitted through them.
PERIOD_TOLERANCE = 0.3
MIN_REGULAR_GAPS = 0.75
# The next onset is expected at least this share of the period off the schedule: a few
# onsets understate how far one may fall (spikes every 1-3 h jittered by up to a tenth of
# the period missed the window drawn from the six before them); a schedule kept to the
# second pays a few minutes of room per period for it.
MIN_SPREAD = 0.1


def observe_rise(
    rises: Rises,
    *,
    observed: float | None,
    now: float,
    lead_time_s: float,
    window_s: float,
    floor_rps: float,
) -> Rises:
    """`rises` after an observation at `now` (`RiseWindow.observe`)."""
    window = RiseWindow(rises, lead_time_s=lead_time_s, window_s=window_s, floor_rps=floor_rps)
    window.observe(observed, now)
    return window.rises()


class RiseWindow:
    """`Rises` while observations (oldest first, as a planner's clock gives them) arrive: one
    at a time in a plan, or a day of them in a row (`warm.derive`) without copying and
    re-sorting the window at each (that was quadratic: 16 s before an nginx simulation)."""

    def __init__(
        self, rises: Rises, *, lead_time_s: float, window_s: float, floor_rps: float
    ) -> None:
        self._lead_time_s = lead_time_s
        self._window_s = window_s
        self._floor_rps = floor_rps
        self._pending = list(rises.pending)
        self._scores = deque(rises.scores)
        self._onsets = list(rises.onsets)
        # The sorted scores no onset's jump measured (`_usual_rise`), built when first asked
        # for and kept up to date from then on.
        self._usual: list[float] | None = None

    def rises(self) -> Rises:
        return Rises(
            pending=tuple(self._pending), scores=tuple(self._scores), onsets=tuple(self._onsets)
        )

    def observe(self, observed: float | None, now: float) -> None:
        """Every observation a whole lead time old becomes a score, the highest demand seen
        within the lead time after it / it (at least `floor_rps`, so a rise from near zero
        within one replica's capacity is not a huge ratio); a large score is an onset unless
        one started within the lead time before it (the same jump, seen from the
        observations before it); scores and onsets older than `window_s` are dropped."""
        pending = self._pending
        if observed is not None:
            pending.append((now, observed))
        kept: list[tuple[float, float]] = []
        for index, (start, value) in enumerate(pending):
            if now - start < self._lead_time_s:
                kept.append((start, value))
                continue
            later = [v for t, v in pending[index + 1 :] if t - start <= self._lead_time_s]
            # An observation nothing followed within the lead time (a gap) measures no rise.
            if later:
                self._score(start, max(later) / max(value, self._floor_rps))
        self._pending = kept
        self._forget(now)

    def _score(self, start: float, score: float) -> None:
        onsets = self._onsets
        if (
            score >= ONSET_MIN_RATIO
            and (not onsets or start - onsets[-1][0] > self._lead_time_s)
            and score > self._usual_rise()
        ):
            onsets.append((start, score))
        self._scores.append((start, score))
        if self._usual is not None and not self._measures_onset(start):
            bisect.insort(self._usual, score)

    def _usual_rise(self) -> float:
        """The q0.99 of the rises that are no onset's (an onset's jump scores from every
        observation within a lead time before it: with frequent onsets, those would make the
        usual rise as large as an onset and hide the next ones)."""
        if self._usual is None:
            self._usual = sorted(_without_onsets(self._scores, self._onsets, self._lead_time_s))
        return _ranked(self._usual, ONSET_USUAL_QUANTILE)

    def _measures_onset(self, start: float) -> bool:
        """Whether a score from `start` saw an onset's jump: the latest onset at or before it
        started within a lead time before it (`_without_onsets`)."""
        latest = bisect.bisect_right(self._onsets, start, key=lambda onset: onset[0]) - 1
        return latest >= 0 and start - self._onsets[latest][0] <= self._lead_time_s

    def _forget(self, now: float) -> None:
        scores, onsets, usual = self._scores, self._onsets, self._usual
        while scores and now - scores[0][0] > self._window_s:
            start, score = scores.popleft()
            if usual is not None and not self._measures_onset(start):
                del usual[bisect.bisect_left(usual, score)]
        while onsets and now - onsets[0][0] > self._window_s:
            front = self._front(onsets[0][0]) if usual is not None else []
            measured = [self._measures_onset(start) for start, _ in front]
            onsets.pop(0)
            # The scores the forgotten onset's jump set apart count as usual ones again.
            for (start, score), was in zip(front, measured, strict=True):
                if was and usual is not None and not self._measures_onset(start):
                    bisect.insort(usual, score)

    def _front(self, onset: float) -> list[tuple[float, float]]:
        """The oldest scores, up to a lead time after `onset`."""
        reach = onset + self._lead_time_s
        return list(itertools.takewhile(lambda item: item[0] <= reach, self._scores))


def _without_onsets(
    scores: Sequence[tuple[float, float]],
    onsets: Sequence[tuple[float, float]],
    lead_time_s: float,
) -> list[float]:
    """The scores that measured no onset's jump: those within a lead time from an onset's
    start saw the same jump."""
    if not scores:
        return []
    times = np.array([start for start, _ in scores], dtype=np.float64)
    values = np.array([score for _, score in scores], dtype=np.float64)
    if onsets:
        starts = np.array([start for start, _ in onsets], dtype=np.float64)
        latest = np.searchsorted(starts, times, side="right") - 1
        since = times - starts[np.maximum(latest, 0)]
        values = values[(latest < 0) | (since > lead_time_s)]
    return [float(value) for value in values]


def conformal_quantile(values: Sequence[float], quantile: float) -> float:
    """The split-conformal `quantile` of `values`: the ceil((n + 1) q)-th smallest (the
    largest when there are too few), never below 1; 1 when there is none."""
    return _ranked(sorted(values), quantile)


def _ranked(ordered: Sequence[float], quantile: float) -> float:
    """`conformal_quantile` of values already sorted."""
    if not ordered:
        return 1.0
    rank = min(math.ceil((len(ordered) + 1) * quantile), len(ordered))
    return max(1.0, ordered[rank - 1])


def rise_quantile(rises: Rises, level: float, *, scores: Sequence[float] | None = None) -> float:
    """The workload's `level` quantile of its rises within one lead time (of `scores` when
    given, else of all); 1 with no score yet (the forecast and the reaction to observed demand
    still apply). With fewer scores than the level can rank, their largest."""
    values = [score for _, score in rises.scores] if scores is None else list(scores)
    return conformal_quantile(values, level)


@dataclass(frozen=True, slots=True)
class Recurrence:
    """Onsets that come back on a schedule: the k-th is due at `phase_s + k x period_s`,
    within `spread_s` (how far from that the next may fall), and brings `ratio`."""

    period_s: float
    phase_s: float
    spread_s: float
    ratio: float

    def due(self, rises: Rises, *, now: float, lead_time_s: float) -> bool:
        """Whether an onset may come within one lead time of `now`: `now` is within the next
        one's window, and none came since that window opened. The window is its spread, a
        lead time after it (an onset's time is an observation up to a lead time before the
        jump) and two before it (the replicas take one to start, and the plan that orders
        them may come up to about as late)."""
        cycle = round((now - self.phase_s) / self.period_s)
        due_at = self.phase_s + cycle * self.period_s
        opens = due_at - self.spread_s - 2 * lead_time_s
        if not opens <= now <= due_at + self.spread_s + lead_time_s:
            return False
        return not any(start >= opens for start, _ in rises.onsets)


def recurrence(rises: Rises, quantile: float) -> Recurrence | None:
    """The schedule the window's onsets follow, or None when they follow none: at least
    `MIN_ONSETS`, most gaps whole periods (the median gap) apart, and every onset within
    `PERIOD_TOLERANCE` of a period of the least-squares schedule through them. Its `ratio` is
    the workload's `quantile` of the onsets' rises."""
    if len(rises.onsets) < MIN_ONSETS:
        return None
    times = np.array([start for start, _ in rises.onsets], dtype=np.float64)
    gaps = np.diff(times)
    guess = float(np.median(gaps))
    cycles = np.round(gaps / guess)
    regular = (cycles >= 1) & (np.abs(gaps - cycles * guess) <= PERIOD_TOLERANCE * guess)
    if float(np.mean(regular)) < MIN_REGULAR_GAPS:
        return None
    index = np.concatenate([[0.0], np.cumsum(np.maximum(cycles, 1.0))])
    period, phase = (float(value) for value in np.polyfit(index, times, 1))
    residuals = times - (phase + period * index)
    farthest = float(np.max(np.abs(residuals)))
    if period <= 0 or farthest > PERIOD_TOLERANCE * period:
        return None
    # The farthest of n onsets from a line fitted through them (two of their n degrees of
    # freedom) understates how far the next may fall: widened by (n + 1) / (n - 1), 1.67x
    # on four onsets, 1.18x on twelve; and the line is itself uncertain where the next is due.
    count = len(times)
    spread = max(
        farthest * (count + 1) / (count - 1) + _next_error(index, residuals),
        MIN_SPREAD * period,
    )
    ratio = conformal_quantile([score for _, score in rises.onsets], quantile)
    return Recurrence(period_s=period, phase_s=phase, spread_s=spread, ratio=ratio)


def _next_error(index: np.ndarray, residuals: np.ndarray) -> float:
    """Two standard errors of the fitted schedule one cycle past its last onset, seconds: a
    day of onsets jittered by a tenth of the period put the line 230 s off where the next was
    due (family-periodic-spikes), and the widened farthest onset alone missed it by 17 s."""
    count = len(index)
    deviation = math.sqrt(float(np.sum(residuals**2)) / (count - 2))
    scatter = float(np.sum((index - np.mean(index)) ** 2))
    ahead = float(index[-1]) + 1.0 - float(np.mean(index))
    return 2.0 * deviation * math.sqrt(1.0 / count + ahead**2 / scatter)


def recent_rise(rises: Rises, *, now: float, lead_time_s: float) -> float:
    """The largest rise measured from the last two lead times' observations (1 with none)."""
    recent = itertools.takewhile(
        lambda item: now - item[0] <= 2 * lead_time_s, reversed(rises.scores)
    )
    return max((score for start, score in recent if start <= now), default=1.0)


def observe(
    workload: ServingWorkload,
    rises: Rises,
    observed: float | None,
    now: float,
    config: PolicyConfig,
) -> Rises:
    """`rises` after an observation at `now`, with the workload's lead time and the
    configured window."""
    rise_window = window(workload, rises, config)
    rise_window.observe(observed, now)
    return rise_window.rises()


def window(workload: ServingWorkload, rises: Rises, config: PolicyConfig) -> RiseWindow:
    """The workload's `RiseWindow` from `rises`: its lead time, the configured window."""
    return RiseWindow(
        rises,
        lead_time_s=workload.lead_time_s,
        window_s=config.rise_window_s,
        # A rise from below one replica's capacity counts from it: a replica serves it anyway.
        floor_rps=workload.capacity_rps,
    )


def priced_rise(
    workload: ServingWorkload,
    rises: Rises,
    observed: float | None,
    now: float,
    level: float,
) -> tuple[float, float, float, float]:
    """Where demand may be one lead time from now at the priced `level` (req/s; 0 without a
    fresh observation), the ratio over the observation that says so, the period of the
    recurring rise that set it (0: none) and the level otherwise (0: the recurring one). The
    ratio is the workload's `level` quantile of its rises, or of its recurring onsets when the
    next is due."""
    recurring = recurrence(rises, level)
    # Onsets on a schedule are priced when the next is due: their jumps are left out of the
    # rise held at all times (on edl-mixed-nginx the 2x step every 540 s is 1.9 % of the
    # scores, which made the q0.99 rise 2x all the time).
    plain = (
        None
        if recurring is None
        else _without_onsets(rises.scores, rises.onsets, workload.lead_time_s)
    )
    ratio, quantile, period_s = rise_quantile(rises, level, scores=plain), level, 0.0
    if (
        recurring is not None
        and recurring.ratio > ratio
        and recurring.due(rises, now=now, lead_time_s=workload.lead_time_s)
    ):
        ratio, period_s, quantile = recurring.ratio, recurring.period_s, 0.0
    return (0.0 if observed is None else observed * ratio), ratio, period_s, quantile
