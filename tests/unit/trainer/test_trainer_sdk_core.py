"""The SDK's pure core: layout of named arrays over pservers, optimisers, exactly-once ledger."""

from __future__ import annotations

import numpy as np
import pytest

from tideshift.services.trainer.core.layout import LayoutError, check_state, describe, plan
from tideshift.services.trainer.core.optim import OptimizerSpec, apply_dense, apply_rows, new_slots
from tideshift.services.trainer.core.pserver_state import (
    MAX_OPEN_EPOCHS,
    GradientPush,
    Ledger,
    PieceUpdate,
    PServerState,
    PushOutcome,
)


def model() -> dict[str, np.ndarray]:
    return {
        "embedding": np.zeros((1000, 16), dtype=np.float32),
        "dense.weight": np.ones((16, 4), dtype=np.float64),
        "bias": np.zeros((), dtype=np.float32),
    }


def test_large_arrays_are_split_by_rows_and_balanced_over_servers() -> None:
    layout = plan(describe(model()), 3, max_piece_bytes=8 * 1024)
    table = layout.pieces_named("embedding")
    assert len(table) == 8  # 64,000 bytes in pieces of 128 rows (8 KiB)
    assert [(p.start, p.stop) for p in table][-1] == (896, 1000)
    assert all(layout.piece_bytes(p) <= 8 * 1024 for p in layout.pieces)
    loads = [sum(layout.piece_bytes(p) for p in layout.pieces_of(s)) for s in range(3)]
    assert max(loads) - min(loads) <= 8 * 1024
    assert {p.server for p in table} == {0, 1, 2}


def test_a_layout_is_the_same_for_every_process() -> None:
    first = plan(describe(model()), 2, max_piece_bytes=4096)
    second = plan(describe(dict(reversed(list(model().items())))), 2, max_piece_bytes=4096)
    assert first == second


def test_bad_arrays_are_named() -> None:
    with pytest.raises(LayoutError, match=r"'ids'.*int64"):
        describe({"ids": np.zeros(3, dtype=np.int64)})
    with pytest.raises(LayoutError, match=r"'wide'.*one row"):
        plan(describe({"wide": np.zeros((2, 5000))}), 1, max_piece_bytes=1024)
    layout = plan(describe(model()), 1)
    wrong = {**model(), "bias": np.zeros((2,), dtype=np.float32)}
    with pytest.raises(LayoutError, match="'bias'"):
        check_state(layout, wrong)


@pytest.mark.parametrize("kind", ["sgd", "momentum", "adagrad", "adam"])
def test_sparse_rows_equal_the_dense_step_on_the_rows_they_touch(kind: str) -> None:
    spec = OptimizerSpec(kind=kind, learning_rate=0.1)  # type: ignore[arg-type]
    rng = np.random.default_rng(1)
    start = rng.normal(size=(10, 3))
    dense_params, sparse_params = start.copy(), start.copy()
    dense_slots, sparse_slots = new_slots(spec, dense_params), new_slots(spec, sparse_params)
    indices = np.array([2, 7, 2])
    rows = rng.normal(size=(3, 3))
    gradient = np.zeros_like(start)
    np.add.at(gradient, indices, rows)
    apply_dense(spec, dense_params, dense_slots, gradient, 1)
    apply_rows(spec, sparse_params, sparse_slots, indices, rows, 1)
    touched = [2, 7]
    assert np.allclose(sparse_params[touched], dense_params[touched])
    untouched = [0, 1, 3, 4, 5, 6, 8, 9]
    assert np.array_equal(sparse_params[untouched], start[untouched])
    assert not np.allclose(sparse_params[touched], start[touched])


def test_adam_moves_each_weight_by_about_the_learning_rate_at_first() -> None:
    spec = OptimizerSpec(kind="adam", learning_rate=0.01)
    params = np.zeros(4)
    slots = new_slots(spec, params)
    apply_dense(spec, params, slots, np.array([1.0, -2.0, 0.5, 3.0]), 1)
    assert np.allclose(params, [-0.01, 0.01, -0.01, -0.01], atol=1e-6)


def test_each_batch_applies_once_in_order_and_duplicates_are_counted() -> None:
    ledger = Ledger(num_shards=2)
    assert ledger.check(0, 0, 0) is None
    ledger.record(0, 0, 0, last=False)
    duplicate = ledger.check(0, 0, 0)
    assert duplicate is not None and duplicate.outcome is PushOutcome.DUPLICATE
    gap = ledger.check(0, 0, 2)
    assert gap is not None and gap.outcome is PushOutcome.REJECTED and gap.next_batch == 1
    ledger.record(0, 0, 1, last=True)
    assert ledger.position(0, 0) == (2, True)
    assert ledger.duplicates == 1 and ledger.applied_batches == 2


def test_the_watermark_keeps_the_ledger_constant_over_many_epochs() -> None:
    ledger = Ledger(num_shards=3)
    for epoch in range(1000):
        for shard in range(3):
            for batch in range(2):
                assert ledger.check(epoch, shard, batch) is None
                ledger.record(epoch, shard, batch, last=batch == 1)
        assert len(ledger.next_batch) == 0 and not ledger.finished
    assert ledger.watermark == 1000 and ledger.applied_batches == 6000
    old = ledger.check(3, 1, 0)
    assert old is not None and old.outcome is PushOutcome.DUPLICATE
    far = ledger.check(1000 + MAX_OPEN_EPOCHS, 0, 0)
    assert far is not None and far.outcome is PushOutcome.REJECTED
    assert len(ledger.missing_before(10**12)) == MAX_OPEN_EPOCHS * 3


def test_a_push_applies_to_every_piece_or_to_none() -> None:
    layout = plan(describe({"w": np.zeros((4, 2)), "b": np.zeros(2)}), 1)
    state = PServerState(layout, 0, OptimizerSpec(kind="sgd", learning_rate=1.0), Ledger(1))
    state.initialise(
        {p.id: np.zeros((p.stop - p.start, *layout.array(p.name).shape[1:])) for p in layout.pieces}
    )
    w = next(p for p in layout.pieces if p.name == "w")
    b = next(p for p in layout.pieces if p.name == "b")
    bad = GradientPush(
        0,
        0,
        0,
        False,
        (
            PieceUpdate(w.id, dense=np.ones((4, 2))),
            PieceUpdate(b.id, dense=np.array([np.nan, 1.0])),
        ),
    )
    assert state.push(bad).outcome is PushOutcome.REJECTED
    assert not state.pieces[w.id].params.any()
    good = GradientPush(
        0,
        0,
        0,
        True,
        (
            PieceUpdate(w.id, indices=np.array([1]), rows=np.array([[2.0, 3.0]])),
            PieceUpdate(b.id, dense=np.array([1.0, 1.0])),
        ),
    )
    assert state.push(good).outcome is PushOutcome.APPLIED
    assert state.pieces[w.id].params[1].tolist() == [-2.0, -3.0]
    assert state.pieces[b.id].params.tolist() == [-1.0, -1.0]
    assert state.push(good).outcome is PushOutcome.DUPLICATE


def test_a_push_is_cut_into_parts_of_whole_piece_updates_that_decode_back() -> None:
    from tideshift.services.trainer.core.messages import (
        pack_push_part,
        split_updates,
        unpack_push_part,
    )

    updates = [PieceUpdate(i, dense=np.full((256,), float(i), dtype=np.float32)) for i in range(5)]
    parts = split_updates(updates, max_bytes=2048)  # two 1 KiB updates per part
    assert [[u.piece for u in part] for part in parts] == [[0, 1], [2, 3], [4]]
    sparse = PieceUpdate(9, indices=np.array([1, 4]), rows=np.ones((2, 3)))
    raw = pack_push_part(
        job="j", push_id="p", epoch=1, shard=2, batch=3, last=True, part=0, parts=1,
        updates=[*parts[0], sparse],
    )  # fmt: skip
    decoded = unpack_push_part(raw)
    assert (decoded.epoch, decoded.shard, decoded.batch, decoded.last) == (1, 2, 3, True)
    assert decoded.updates[1].dense is not None and decoded.updates[1].dense[0] == 1.0
    assert decoded.updates[2].indices is not None and decoded.updates[2].indices.tolist() == [1, 4]
