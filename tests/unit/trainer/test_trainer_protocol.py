"""Coordinator progress and pserver at-most-once apply, stepped through explicit observations."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from tideshift.services.trainer.checkpoint import decode_checkpoint, encode_checkpoint
from tideshift.services.trainer.model import KeyRange, initial_state
from tideshift.services.trainer.protocol import (
    CoordinatorState,
    GradientPush,
    Observation,
    PServerState,
    PushOutcome,
    TaskSpec,
    applied_everywhere,
    handle_push,
    mark_published,
    new_coordinator,
    progress_fraction,
    resume_coordinator,
    step,
)
from tideshift.services.trainer.wire import WireError, pack, unpack


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

RANGE = KeyRange(0, 4)


def fresh() -> PServerState:
    return PServerState(job="ctr", optimizer=initial_state(RANGE))


def push(**overrides: object) -> GradientPush:
    fields: dict[str, object] = {
        "job": "ctr",
        "epoch": 0,
        "shard": 1,
        "delivery": 1,
        "key_range": RANGE,
        "gradient": np.ones(4),
    }
    fields.update(overrides)
    return GradientPush(**fields)  # type: ignore[arg-type]


def test_each_epoch_shard_is_applied_at_most_once() -> None:
    state, result = handle_push(fresh(), push(), learning_rate=0.1, num_shards=8)
    assert result.outcome is PushOutcome.APPLIED
    params_after_first = state.optimizer.params.copy()
    again, result = handle_push(state, push(delivery=2), learning_rate=0.1, num_shards=8)
    assert result.outcome is PushOutcome.DUPLICATE
    assert again is state
    assert np.array_equal(again.optimizer.params, params_after_first)
    assert state.version == 1 and state.redelivered == 0
    # The same shard in another epoch is new work.
    state, result = handle_push(state, push(epoch=1, delivery=3), learning_rate=0.1, num_shards=8)
    assert result.outcome is PushOutcome.APPLIED
    assert state.applied_in(1) == {1} and state.redelivered == 2


@pytest.mark.parametrize(
    ("overrides", "reason"),
    [
        ({"job": "other"}, "unknown job 'other'"),
        ({"epoch": -1}, "must be >= 0"),
        ({"shard": 8}, "shard 8 out of range: the job has 8 shards"),
        ({"delivery": 0}, "delivery must be >= 1"),
        ({"key_range": KeyRange(4, 8)}, "does not match"),
        ({"gradient": np.ones(5)}, "expected shape"),
        ({"gradient": np.array([1.0, np.nan, 0.0, 0.0])}, "non-finite"),
    ],
)
def test_bad_push_rejected_with_reason_and_params_untouched(
    overrides: dict[str, object], reason: str
) -> None:
    start = fresh()
    state, result = handle_push(start, push(**overrides), learning_rate=0.1, num_shards=8)
    assert result.outcome is PushOutcome.REJECTED
    assert reason in result.reason
    assert state is start
    assert np.array_equal(state.optimizer.params, np.zeros(4))
    assert not state.applied


def test_checkpoint_round_trip_keeps_params_and_applied_set() -> None:
    state, _ = handle_push(fresh(), push(delivery=2), learning_rate=0.1, num_shards=8)
    state, _ = handle_push(state, push(epoch=1, shard=0), learning_rate=0.1, num_shards=8)
    restored = decode_checkpoint(encode_checkpoint(state), job="ctr", key_range=RANGE)
    assert np.array_equal(restored.optimizer.params, state.optimizer.params)
    assert np.array_equal(
        restored.optimizer.squared_gradient_sum, state.optimizer.squared_gradient_sum
    )
    assert dict(restored.applied) == {(0, 1): 2, (1, 0): 1}
    assert restored.version == 2
    # A restored pserver still refuses what it applied before.
    _, result = handle_push(restored, push(), learning_rate=0.1, num_shards=8)
    assert result.outcome is PushOutcome.DUPLICATE


@pytest.mark.parametrize(
    ("job", "key_range", "reason"),
    [("other", RANGE, "for job 'ctr'"), ("ctr", KeyRange(0, 5), "covers keys")],
)
def test_checkpoint_for_another_job_or_range_refused(
    job: str, key_range: KeyRange, reason: str
) -> None:
    with pytest.raises(WireError, match=reason):
        decode_checkpoint(encode_checkpoint(fresh()), job=job, key_range=key_range)


# --------------------------------------------------------------------------------------- wire


def test_wire_round_trip() -> None:
    payload = pack({"job": "ctr", "epoch": 3}, {"g": np.arange(5, dtype=np.float64)})
    header, arrays = unpack(payload)
    assert header == {"job": "ctr", "epoch": 3}
    assert np.array_equal(arrays["g"], np.arange(5))


@pytest.mark.parametrize(
    ("payload", "reason"),
    [
        (b"\x00", "shorter than its length prefix"),
        (b"\x00\x00\x00\x10{}", "does not fit"),
        (b"\x00\x00\x00\x02{x", "not JSON"),
        (b"\x00\x00\x00\x02[]", "expected an object"),
        (pack({"a": 1}, {"g": np.zeros(2)})[:-3], "payload too short"),
        (pack({"a": 1}, {"g": np.zeros(2)}) + b"xx", "trailing bytes"),
    ],
)
def test_wire_rejects_malformed(payload: bytes, reason: str) -> None:
    with pytest.raises(WireError, match=reason):
        unpack(payload)
