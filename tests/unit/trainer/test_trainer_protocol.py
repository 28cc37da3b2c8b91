"""Coordinator progress stepped through explicit observations; pserver checkpoints; wire."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from tideshift.services.trainer.core.checkpoint import decode_checkpoint, encode_checkpoint
from tideshift.services.trainer.core.layout import describe, plan
from tideshift.services.trainer.core.optim import OptimizerSpec
from tideshift.services.trainer.core.protocol import (
    CoordinatorState,
    Observation,
    TaskSpec,
    applied_everywhere,
    mark_published,
    new_coordinator,
    progress_fraction,
    resume_coordinator,
    step,
)
from tideshift.services.trainer.core.pserver_state import (
    GradientPush,
    Ledger,
    PieceUpdate,
    PServerState,
    PushOutcome,
)
from tideshift.services.trainer.core.wire import WireError, pack, unpack


def keys(epoch: int, shards: range | list[int]) -> frozenset[tuple[int, int]]:
    return frozenset((epoch, s) for s in shards)


def publish_all(
    state: CoordinatorState, observation: Observation
) -> tuple[CoordinatorState, list[TaskSpec]]:
    state, decision = step(state, observation)
    return mark_published(state, decision.publish), list(decision.publish)


# --------------------------------------------------------------------------------- coordinator


def test_first_step_publishes_every_shard_once() -> None:
    state = new_coordinator("ctr", num_shards=3, epochs=2)
    state, tasks = publish_all(state, Observation(queued_tasks=0, applied=frozenset()))
    assert [(t.epoch, t.shard, t.round) for t in tasks] == [(0, 0, 1), (0, 1, 1), (0, 2, 1)]
    # Queue still full, nothing applied: nothing more to publish.
    state, tasks = publish_all(state, Observation(queued_tasks=3, applied=frozenset()))
    assert tasks == []
    # Partly applied, rest in flight: still nothing.
    state, tasks = publish_all(state, Observation(queued_tasks=1, applied=keys(0, [0, 2])))
    assert tasks == []
    assert state.applied == {0, 2}


def test_epoch_advances_only_when_every_shard_applied_and_job_finishes() -> None:
    state = new_coordinator("ctr", num_shards=2, epochs=2)
    state, _ = publish_all(state, Observation(0, frozenset()))
    state, decision = step(state, Observation(0, keys(0, [0, 1])))
    assert decision.completed_epochs == (0,)
    assert [(t.epoch, t.shard) for t in decision.publish] == [(1, 0), (1, 1)]
    state = mark_published(state, decision.publish)
    assert state.epoch == 1 and not state.finished
    state, decision = step(state, Observation(0, keys(0, [0, 1]) | keys(1, [0, 1])))
    assert decision.finished and decision.completed_epochs == (1,)
    assert state.finished
    assert progress_fraction(state) == 1.0
    # Finished is sticky until a restart re-checks it.
    _, decision = step(state, Observation(0, frozenset()))
    assert decision.finished and decision.publish == ()


def test_lost_work_is_republished_in_a_new_round() -> None:
    """The pserver restored an older checkpoint: shard 1 was acked but is no longer applied."""
    state = new_coordinator("ctr", num_shards=3, epochs=1)
    state, _ = publish_all(state, Observation(0, frozenset()))
    state, decision = step(state, Observation(queued_tasks=0, applied=keys(0, [0, 2])))
    assert [(t.shard, t.round) for t in decision.publish] == [(1, 2)]
    assert decision.republished == 1
    assert decision.publish[0].message_id("ctr") == "ctr.0.1.2"
    state = mark_published(state, decision.publish)
    assert state.republished == 1
    # While the republished task is queued nothing else happens.
    _, decision = step(state, Observation(queued_tasks=1, applied=keys(0, [0, 2])))
    assert decision.publish == ()


def test_restart_from_persisted_state_does_not_reissue_finished_work() -> None:
    state = new_coordinator("ctr", num_shards=4, epochs=3)
    state, _ = publish_all(state, Observation(0, frozenset()))
    state, _ = publish_all(state, Observation(0, keys(0, range(4))))  # epoch 1 published
    persisted = CoordinatorState.from_json(state.to_json())
    assert persisted == state
    resumed = resume_coordinator(persisted, job="ctr", num_shards=4, epochs=3)
    # Two of epoch 1 applied meanwhile, two still queued: nothing to publish.
    _, decision = step(resumed, Observation(2, keys(0, range(4)) | keys(1, [0, 3])))
    assert decision.publish == ()


def test_restart_mid_publish_repeats_the_same_message_ids() -> None:
    """A crash between publishing and persisting: the successor starts from the state persisted
    before the step, so it publishes the same ids and the queue drops the duplicates."""
    persisted = new_coordinator("ctr", num_shards=4, epochs=1)
    _, first = step(persisted, Observation(0, frozenset()))
    resumed = resume_coordinator(
        CoordinatorState.from_json(persisted.to_json()), job="ctr", num_shards=4, epochs=1
    )
    _, again = step(resumed, Observation(2, frozenset()))
    assert [t.message_id("ctr") for t in again.publish] == [
        t.message_id("ctr") for t in first.publish
    ]


def test_lost_shards_of_earlier_epochs_are_republished_at_once_and_block_the_finish() -> None:
    """The pserver restored a checkpoint from epoch 0 while the coordinator is in epoch 1."""
    state = new_coordinator("ctr", num_shards=2, epochs=2)
    state, _ = publish_all(state, Observation(0, frozenset()))
    state, _ = publish_all(state, Observation(0, keys(0, [0, 1])))
    assert state.epoch == 1
    lost = Observation(queued_tasks=2, applied=frozenset(), missing_before=keys(0, [1]))
    state, decision = step(state, lost)
    assert [(t.epoch, t.shard) for t in decision.publish] == [(0, 1)]
    state = mark_published(state, decision.publish)
    assert state.requeued == {(0, 1)}
    # Still queued: not published a second time.
    _, decision = step(state, lost)
    assert decision.publish == ()
    # Epoch 1 done but (0, 1) still missing: not finished.
    done_but_missing = Observation(1, keys(1, [0, 1]), missing_before=keys(0, [1]))
    state, decision = step(state, done_but_missing)
    assert not decision.finished and decision.publish == ()
    # The requeued task vanished without being applied (lost again): published again.
    state, decision = step(state, Observation(0, keys(1, [0, 1]), missing_before=keys(0, [1])))
    assert [(t.epoch, t.shard) for t in decision.publish] == [(0, 1)]
    state = mark_published(state, decision.publish)
    state, decision = step(state, Observation(0, keys(1, [0, 1])))
    assert decision.finished and state.requeued == frozenset()


def test_restart_after_unpersisted_epoch_advance_skips_applied_shards() -> None:
    """Persisted state says epoch 0, but the pserver already applied all of it and part of 1."""
    state = mark_published(
        new_coordinator("ctr", num_shards=2, epochs=3),
        [TaskSpec(0, 0, 0), TaskSpec(0, 1, 0)],
    )
    state, decision = step(state, Observation(1, keys(0, [0, 1]) | keys(1, [1])))
    assert state.epoch == 1
    assert [(t.epoch, t.shard) for t in decision.publish] == [(1, 0)]


@pytest.mark.parametrize(
    ("persisted_job", "shards", "reason"),
    [("other", 4, "is for job 'other'"), ("ctr", 5, "started with 5 shards")],
)
def test_resume_refuses_mismatched_state(persisted_job: str, shards: int, reason: str) -> None:
    persisted = new_coordinator(persisted_job, num_shards=shards, epochs=1)
    with pytest.raises(ValueError, match=reason):
        resume_coordinator(persisted, job="ctr", num_shards=4, epochs=1)


def test_resume_rechecks_a_finished_job() -> None:
    finished = dataclasses.replace(new_coordinator("ctr", num_shards=1, epochs=1), finished=True)
    resumed = resume_coordinator(finished, job="ctr", num_shards=1, epochs=1)
    _, decision = step(resumed, Observation(0, keys(0, [0])))
    assert decision.finished and decision.publish == ()


def test_resume_with_more_epochs_continues_a_finished_job() -> None:
    finished = dataclasses.replace(new_coordinator("ctr", num_shards=1, epochs=1), finished=True)
    resumed = resume_coordinator(finished, job="ctr", num_shards=1, epochs=2)
    assert not resumed.finished
    state, decision = step(resumed, Observation(0, keys(0, [0])))
    assert state.epoch == 1 and [(t.epoch, t.shard) for t in decision.publish] == [(1, 0)]


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        ({"job": "x"}, "missing field"),
        (
            {
                "job": "x",
                "num_shards": 2,
                "epochs": 1,
                "epoch": 0,
                "round": 0,
                "published": [5],
                "applied": [],
                "republished": 0,
                "finished": False,
            },
            "out of range",
        ),
        (
            {
                "job": "x",
                "num_shards": "two",
                "epochs": 1,
                "epoch": 0,
                "round": 0,
                "published": [],
                "applied": [],
                "republished": 0,
                "finished": False,
            },
            "coordinator state",
        ),
    ],
)
def test_corrupt_persisted_state_is_refused(data: dict[str, object], reason: str) -> None:
    with pytest.raises(ValueError, match=reason):
        CoordinatorState.from_json(data)


def test_applied_everywhere_is_the_intersection() -> None:
    assert applied_everywhere([{(0, 1), (0, 2)}, {(0, 2), (0, 3)}]) == {(0, 2)}
    assert applied_everywhere([]) == frozenset()


# ------------------------------------------------------------------------------------ pserver


def trained_state() -> PServerState:
    layout = plan(describe({"table": np.zeros((6, 2), dtype=np.float32), "b": np.zeros(())}), 2)
    state = PServerState(layout, 0, OptimizerSpec(kind="adam"), Ledger(num_shards=3))
    state.initialise(
        {p.id: np.full((p.stop - p.start, *layout.array(p.name).shape[1:]), 0.5)
         for p in state.owned()}
    )  # fmt: skip
    for epoch, shard, batches in ((0, 0, 2), (0, 1, 1), (1, 2, 1)):
        for batch in range(batches):
            updates = tuple(
                PieceUpdate(p.id, dense=np.ones_like(state.pieces[p.id].params))
                for p in state.owned()
            )
            push = GradientPush(epoch, shard, batch, batch == batches - 1, updates)
            assert state.push(push).outcome is PushOutcome.APPLIED
    return state


def test_checkpoint_round_trip_keeps_pieces_slots_and_ledger() -> None:
    state = trained_state()
    restored = decode_checkpoint(encode_checkpoint(state), expected=fresh_like(state))
    for piece_id, piece in state.pieces.items():
        again = restored.pieces[piece_id]
        assert again.params.dtype == piece.params.dtype
        assert np.array_equal(again.params, piece.params)
        assert np.array_equal(again.slots["moment2"], piece.slots["moment2"])
        assert again.steps == piece.steps == 4
    assert restored.ledger.position(0, 0) == (2, True)
    assert restored.ledger.position(1, 2) == (1, True)
    assert restored.ledger.applied_batches == 4
    # A restored pserver still refuses what it applied before.
    assert restored.ledger.check(0, 0, 1) is not None


def test_applies_that_climb_back_to_what_was_applied_before_a_restore_are_retrained() -> None:
    """A pserver that had applied 6 batches restores a checkpoint of 4 (trained_state): the
    next 2 applies redo lost work, later ones are new; the counts survive a checkpoint."""
    state = trained_state()
    state.ledger.high_water = 6
    for batch in range(4):
        updates = tuple(
            PieceUpdate(p.id, dense=np.ones_like(state.pieces[p.id].params)) for p in state.owned()
        )
        assert state.push(GradientPush(1, 0, batch, False, updates)).outcome is (
            PushOutcome.APPLIED
        )
        assert state.ledger.retrained == min(batch + 1, 2)
    assert state.ledger.applied_batches == 8
    restored = decode_checkpoint(encode_checkpoint(state), expected=fresh_like(state))
    assert (restored.ledger.retrained, restored.ledger.high_water) == (2, 6)


def test_a_checkpoint_from_before_retrained_was_counted_restores_with_none() -> None:
    state = trained_state()
    header, arrays = unpack(encode_checkpoint(state))
    del header["retrained"], header["high_water"]
    restored = decode_checkpoint(pack(header, arrays), expected=fresh_like(state))
    assert (restored.ledger.retrained, restored.ledger.high_water) == (0, 0)
    assert restored.ledger.applied_batches == 4


def test_a_pserver_holding_no_piece_of_a_small_model_initialises_and_records_batches() -> None:
    """A one-piece model on two pservers leaves pserver 1 with nothing to hold; it must still
    say initialised (the job hung waiting for it) and record batches, across a checkpoint."""
    layout = plan(describe({"w": np.zeros(4, dtype=np.float32)}), 2)
    state = PServerState(layout, 1, OptimizerSpec(), Ledger(num_shards=1))
    assert state.owned() == () and not state.initialised
    state.initialise({})
    assert state.initialised
    assert state.push(GradientPush(0, 0, 0, True, ())).outcome is PushOutcome.APPLIED
    restored = decode_checkpoint(encode_checkpoint(state), expected=fresh_like(state))
    assert restored.initialised
    assert (restored.ledger.watermark, restored.ledger.applied_batches) == (1, 1)


def fresh_like(state: PServerState, **changes: object) -> PServerState:
    fields: dict[str, object] = {
        "layout": state.layout, "index": state.index, "optimizer": state.optimizer,
        "ledger": Ledger(num_shards=state.ledger.num_shards),
    }  # fmt: skip
    fields.update(changes)
    return PServerState(**fields)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("changes", "reason"),
    [
        ({"index": 1}, "of pserver 0, not 1"),
        ({"ledger": Ledger(num_shards=4)}, "another shard count"),
        (
            {"layout": plan(describe({"other": np.zeros(3)}), 2)},
            "another model layout",
        ),
    ],
)
def test_checkpoint_of_another_layout_pserver_or_job_refused(
    changes: dict[str, object], reason: str
) -> None:
    state = trained_state()
    with pytest.raises(WireError, match=reason):
        decode_checkpoint(encode_checkpoint(state), expected=fresh_like(state, **changes))


# --------------------------------------------------------------------------------------- wire


def test_wire_round_trip_keeps_float32_and_float64() -> None:
    payload = pack(
        {"job": "ctr", "epoch": 3},
        {"g": np.arange(5, dtype=np.float64), "h": np.ones((2, 3), dtype=np.float32)},
    )
    header, arrays = unpack(payload)
    assert header == {"job": "ctr", "epoch": 3}
    assert np.array_equal(arrays["g"], np.arange(5))
    assert arrays["h"].dtype == np.float32 and arrays["h"].shape == (2, 3)


@pytest.mark.parametrize(
    ("payload", "reason"),
    [
        (b"\x00", "shorter than its length prefix"),
        (b"\x00\x00\x00\x10{}", "does not fit"),
        (b"\x00\x00\x00\x02{x", "not JSON"),
        (b"\x00\x00\x00\x02[]", "expected an object"),
        (b"\x00\x00\xea\x60" + b"[" * 60_000, "not JSON: RecursionError"),
        (b"\x00\x00\x13\x8e" + b'{"a":' + b"9" * 5_000 + b"}", "not JSON: ValueError"),
        (pack({"a": 1}, {"g": np.zeros(2)})[:-3], "payload too short"),
        (pack({"a": 1}, {"g": np.zeros(2)}) + b"xx", "trailing bytes"),
    ],
)
def test_wire_rejects_malformed(payload: bytes, reason: str) -> None:
    with pytest.raises(WireError, match=reason):
        unpack(payload)
