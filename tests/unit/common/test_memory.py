"""Tables keyed by outside names give their slots back once the names are gone
(services/common/memory.py): CPython never shrinks a dict or a set on deletion."""

from __future__ import annotations

import sys
from dataclasses import dataclass, field

from tideshift.services.common.memory import compact_tables, compacted

FLOOD = 100_000


def test_a_table_a_flood_left_is_copied_to_its_size_in_the_same_order() -> None:
    table = {f"w-{i}": i for i in range(FLOOD)}
    for name in list(table)[:-3]:
        del table[name]
    before = sys.getsizeof(table)

    small = compacted(table)

    assert small is not table
    assert list(small.items()) == [(f"w-{i}", i) for i in range(FLOOD - 3, FLOOD)]
    assert sys.getsizeof(small) < before / 100


def test_a_full_or_small_table_is_left_as_it_is() -> None:
    full = {f"w-{i}": i for i in range(FLOOD)}
    small = {f"w-{i}": i for i in range(10)}
    del small["w-0"]
    assert compacted(full) is full
    assert compacted(small) is small


def test_every_table_of_an_owner_is_compacted_and_nothing_else_changes() -> None:
    @dataclass
    class Owner:
        names: dict[str, int] = field(default_factory=dict)
        gone: set[str] = field(default_factory=set)
        order: list[str] = field(default_factory=list)

    owner = Owner({f"w-{i}": i for i in range(FLOOD)}, {f"w-{i}" for i in range(FLOOD)})
    owner.order = list(owner.names)
    for name in owner.order[1:]:
        del owner.names[name]
        owner.gone.discard(name)
    order = owner.order

    compact_tables(owner)

    assert owner.names == {"w-0": 0} and owner.gone == {"w-0"}
    assert sys.getsizeof(owner.names) < 1024 and sys.getsizeof(owner.gone) < 1024
    assert owner.order is order  # not a table: untouched
