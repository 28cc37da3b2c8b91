"""Serving's rise history (core/serving/warm.py) kept in a NATS KV bucket, one key per workload, so
a restarted planner does not meet the next spikes of a schedule it had learned by reaction
alone.

The leader saves each serving workload's bounded history every `SAVE_EVERY_S`; a planner
loads it before its first plan with the workloads it then sizes (a history saved for another
lead time measured other rises and is left out). The bucket's age limit is the rise window:
the key of a workload no planner sizes any more goes by itself, and a history older than the
window would be dropped on load anyway. A read or write that fails is logged and counted,
and the planner plans on without it."""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Annotated, Any

from prometheus_client import Counter
from pydantic import BaseModel, ConfigDict, Field

from tideshift.events import WorkloadRef, encode_token
from tideshift.services.common.bus import TypedKV
from tideshift.services.common.bus.port import BusPort
from tideshift.services.planner import core as pol
from tideshift.services.planner.core.model import Rises
from tideshift.services.planner.core.serving import warm
from tideshift.services.planner.settings import PlannerSettings

log = logging.getLogger("tideshift.planner.rises")

# Often enough that a restart loses a few minutes of rises at most, rarely enough that a
# thousand workloads' histories (tens of kB each) are a trickle.
SAVE_EVERY_S = 300.0
SAVES_AT_ONCE = 32

RISE_HISTORY = Counter(
    "tideshift_planner_rise_history_total",
    "Serving rise histories loaded, saved, or failed to be",
    ["outcome"],
)

FiniteTime = Annotated[float, Field(allow_inf_nan=False)]
RiseRatio = Annotated[float, Field(ge=0, allow_inf_nan=False)]


class RiseHistory(BaseModel):
    """One serving workload's rises within a lead time, and its onsets, as saved."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    target: WorkloadRef
    lead_time_s: float = Field(ge=0, allow_inf_nan=False)
    saved_at: FiniteTime
    scores: list[tuple[FiniteTime, RiseRatio]] = Field(max_length=warm.MAX_SCORES)
    onsets: list[tuple[FiniteTime, RiseRatio]] = Field(max_length=warm.MAX_ONSETS)

    def rises(self) -> Rises:
        return Rises(scores=tuple(self.scores), onsets=tuple(self.onsets))


def history_key(target: WorkloadRef) -> str:
    return ".".join(encode_token(part) for part in (target.namespace, target.kind, target.name))


@dataclass
class RiseStore:
    """Loads once, then saves on the leader's plans; `bucket` "" keeps nothing."""

    bus: BusPort
    bucket: str
    window_s: float
    loaded: bool = False
    saved_at: float = -math.inf
    _kv: TypedKV | None = field(default=None, init=False)

    @classmethod
    def of(cls, bus: BusPort, settings: PlannerSettings) -> RiseStore:
        return cls(bus, settings.rise_history_bucket, settings.rise_window_s)

    async def _bucket(self) -> TypedKV:
        if self._kv is None:
            self._kv = await self.bus.kv(self.bucket, ttl_seconds=self.window_s)
        return self._kv

    async def warm(self, state: Any, serving: Sequence[pol.ServingWorkload], now: float) -> Any:
        """`state` started from the saved histories of `serving`, on the first call that
        reads the bucket; `state` as it is after that, or for a policy without rises."""
        if self.loaded or not self.bucket or not isinstance(state, pol.PlanState):
            return state
        try:
            kv = await self._bucket()
            found: dict[pol.Target, Rises] = {}
            for workload in serving:
                saved = await kv.get(history_key(workload.target), RiseHistory)
                if saved is not None and saved.lead_time_s == workload.lead_time_s:
                    found[workload.target] = warm.bounded(
                        saved.rises(), now=now, window_s=self.window_s
                    )
        except Exception as error:  # the next plan tries again
            RISE_HISTORY.labels("load_failed").inc()
            log.warning("cannot read rise histories from %s: %s", self.bucket, error)
            return state
        self.loaded = True
        RISE_HISTORY.labels("loaded").inc(len(found))
        log.info("started %d serving workloads from their rise history", len(found))
        return warm.warm_state(state, found)

    async def save(
        self, state: Any, serving: Sequence[pol.ServingWorkload], now: float, *, leader: bool
    ) -> None:
        """Each workload's bounded history, at most every `SAVE_EVERY_S`, by the leader only
        (a passive planner's would overwrite it with the same demand seen later)."""
        if not leader or not self.bucket or not isinstance(state, pol.PlanState):
            return
        if now - self.saved_at < SAVE_EVERY_S:
            return
        self.saved_at = now
        held = warm.held_rises(state, now=now, window_s=self.window_s)
        values = [
            RiseHistory(
                target=workload.target,
                lead_time_s=workload.lead_time_s,
                saved_at=now,
                scores=list(rises.scores),
                onsets=list(rises.onsets),
            )
            for workload in serving
            if (rises := held.get(workload.target)) is not None
        ]
        try:
            kv = await self._bucket()
            # A few writes in flight at once: one at a time, thousands of workloads held the
            # plan that saves them for seconds (a request each).
            for start in range(0, len(values), SAVES_AT_ONCE):
                batch = values[start : start + SAVES_AT_ONCE]
                await asyncio.gather(*(kv.put(history_key(v.target), v) for v in batch))
                RISE_HISTORY.labels("saved").inc(len(batch))
        except Exception as error:  # the next save tries again
            RISE_HISTORY.labels("save_failed").inc()
            log.warning("cannot save rise histories to %s: %s", self.bucket, error)
