"""The real training's progress over the demo: samples each job's parameter servers applied
(from the coordinators' progress events) and the held-out log loss of the parameters they hold.

The loss is measured the way a reader of the job would: the demo pulls the current parameters
from the job's parameter servers (without joining the job as a trainer) and scores the
dataset's held-out impressions, which no trainer ever sees.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from tideshift.services.common.bus import Bus
from tideshift.services.common.clock import WALL_CLOCK, wait_for_event
from tideshift.services.trainer.core.model import (
    DatasetSpec,
    ShardData,
    generate_holdout,
    log_loss,
    parse_uri,
)
from tideshift.services.trainer.port.jobs import read_layout, read_spec
from tideshift.services.trainer.port.pserver_client import PServerClient

log = logging.getLogger("tideshift.demo.progress")


@dataclass(frozen=True)
class ProgressPoint:
    clock_s: float  # simulated seconds since the measured day started
    wall_s: float  # wall seconds since the recorder started
    applied_samples: int  # samples the job's parameter servers applied so far
    holdout_loss: float | None


@dataclass
class ProgressRecorder:
    """Samples every job's progress every `every_wall_s` wall seconds."""

    bus: Bus
    jobs: Sequence[str]
    samples_per_update: int  # samples in one applied batch (the demo's dataset batch size)
    every_wall_s: float = 5.0
    points: dict[str, list[ProgressPoint]] = field(default_factory=dict)
    _holdouts: dict[DatasetSpec, ShardData] = field(default_factory=dict)

    async def holdout_loss(self, job: str) -> float | None:
        """Log loss of the job's current parameters on its held-out data; None until the
        first trainer initialised the model."""
        spec = await read_spec(self.bus, job)
        layout = None if spec is None else await read_layout(self.bus, spec)
        if spec is None or layout is None:
            return None
        params = await PServerClient(self.bus, spec, layout).pull()
        dataset, _ = parse_uri(spec.shards[0])
        holdout = self._holdouts.get(dataset)
        if holdout is None:
            holdout = self._holdouts[dataset] = generate_holdout(dataset)
        return log_loss(params, holdout)

    async def follow(
        self,
        *,
        clock_s: Callable[[], float],
        applied_batches: Callable[[str], int],
        stopping: asyncio.Event,
    ) -> None:
        """Until `stopping`: a point per job per period (a failed read leaves a gap)."""
        started = time.monotonic()
        while not stopping.is_set():
            for job in self.jobs:
                try:
                    loss = await self.holdout_loss(job)
                except Exception as error:  # a pserver restarting: skip this point
                    log.warning("held-out loss of %s not read: %s", job, error)
                    continue
                self.points.setdefault(job, []).append(
                    ProgressPoint(
                        clock_s=clock_s(),
                        wall_s=time.monotonic() - started,
                        applied_samples=applied_batches(job) * self.samples_per_update,
                        holdout_loss=loss,
                    )
                )
            await wait_for_event(WALL_CLOCK, stopping, self.every_wall_s)

    def series(self) -> dict[str, dict[str, list[Any]]]:
        """Per job: simulated hours, samples applied per wall minute, held-out loss."""
        return rates(self.points)


def rates(points: Mapping[str, Sequence[ProgressPoint]]) -> dict[str, dict[str, list[Any]]]:
    """Per job, between consecutive points: when (simulated hours), samples applied per wall
    minute, and the held-out loss at the later point."""
    out: dict[str, dict[str, list[Any]]] = {}
    for job, series in points.items():
        hours, per_minute, losses = [], [], []
        for earlier, later in itertools.pairwise(series):
            wall = later.wall_s - earlier.wall_s
            if wall <= 0:
                continue
            hours.append(later.clock_s / 3600.0)
            per_minute.append((later.applied_samples - earlier.applied_samples) / wall * 60.0)
            losses.append(later.holdout_loss)
        out[job] = {"hours": hours, "samples_per_minute": per_minute, "holdout_loss": losses}
    return out
