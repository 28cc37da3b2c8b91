"""What a pserver keeps on the bus: its checkpoint (pieces, optimiser slots and ledger in the
JetStream object store) and its progress record (how many batches it applied, in KV), and
how `tideshift training reset` forgets both."""

from __future__ import annotations

import logging

from tideshift.events import TRAINER_JOBS_BUCKET
from tideshift.events.tokens import encode_token
from tideshift.services.common.bus import Bus, TypedKV
from tideshift.services.trainer.core.checkpoint import decode_checkpoint
from tideshift.services.trainer.core.jobspec import JobSpec, PServerProgress
from tideshift.services.trainer.core.layout import Layout
from tideshift.services.trainer.core.pserver_state import Ledger, PServerState
from tideshift.services.trainer.core.wire import WireError
from tideshift.services.trainer.port.bus import load_object, progress_key, store_object

log = logging.getLogger("tideshift.pserver")


def checkpoint_name(job: str, index: int) -> str:
    return f"{encode_token(job)}.pserver-{index}"


async def forget(bus: Bus, job: str, index: int) -> None:
    """Drop pserver `index`'s checkpoint and progress record (a job reset)."""
    # An empty checkpoint reads as none (restore): the object store keeps no delete.
    await store_object(bus, checkpoint_name(job, index), b"")
    jobs: TypedKV = await bus.kv(TRAINER_JOBS_BUCKET)
    await jobs.delete(progress_key(job, index))


async def _recorded_progress(bus: Bus, job: str, index: int) -> int:
    jobs: TypedKV = await bus.kv(TRAINER_JOBS_BUCKET)
    progress = await jobs.get(progress_key(job, index), PServerProgress)
    return 0 if progress is None else progress.applied


async def restore(bus: Bus, spec: JobSpec, layout: Layout, index: int) -> PServerState:
    """The last checkpoint, or an uninitialised state; raises ValueError if unusable."""
    fresh = PServerState(layout, index, spec.optimizer, Ledger(num_shards=spec.num_shards))
    payload = await load_object(bus, checkpoint_name(spec.job, index))
    if not payload:  # `tideshift training reset` leaves an empty one
        log.info("job %s: pserver %d has no checkpoint yet", spec.job, index)
        return fresh
    try:
        state = decode_checkpoint(payload, expected=fresh)
    except WireError as error:
        raise ValueError(
            f"job {spec.job}: checkpoint of pserver {index} unusable: {error}"
        ) from error
    ledger = state.ledger
    ledger.high_water = max(ledger.high_water, await _recorded_progress(bus, spec.job, index))
    log.info(
        "job %s: pserver %d restored %d applied batches (watermark %d); %d applied after this "
        "checkpoint were lost and are trained again",
        spec.job,
        index,
        ledger.applied_batches,
        ledger.watermark,
        max(0, ledger.high_water - ledger.applied_batches),
    )
    return state
