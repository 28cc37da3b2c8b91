"""Kubernetes state ordered by resourceVersion: older changes dropped, a deletion wins over an
older or equal add, tombstones bounded."""

from __future__ import annotations

import pytest

from tideshift.services.watcher.core.snapshot import VersionOrder, older, version_number


def test_versions_are_numbers_or_unordered() -> None:
    assert version_number("12345") == 12345
    assert version_number("") is None and version_number("abc") is None
    assert version_number("-1") is None
    assert older("9", "10") and not older("10", "9") and not older("", "10")


def test_an_older_change_is_dropped() -> None:
    order = VersionOrder()
    assert order.admit("pod.a", "added", "10")
    assert order.admit("pod.a", "modified", "12")
    assert not order.admit("pod.a", "modified", "11")
    assert order.admit("pod.a", "modified", "12")  # the same state again (a relist)


@pytest.mark.parametrize("late", ["added", "modified"])
def test_a_deletion_wins_over_an_older_or_equal_add(late: str) -> None:
    order = VersionOrder()
    assert order.admit("pod.a", "added", "10")
    assert order.admit("pod.a", "deleted", "15")
    assert not order.admit("pod.a", late, "10")  # type: ignore[arg-type]
    assert not order.admit("pod.a", late, "15")  # type: ignore[arg-type]
    assert order.admit("pod.a", "added", "16")  # recreated later under the same name


def test_a_deletion_relisted_with_the_objects_last_version_still_counts() -> None:
    # A relist reports a deletion with the version last seen: equal, not older.
    order = VersionOrder()
    assert order.admit("pod.a", "added", "10")
    assert order.admit("pod.a", "deleted", "10")
    assert not order.admit("pod.a", "added", "10")


def test_unversioned_changes_go_in_arrival_order() -> None:
    order = VersionOrder()
    assert order.admit("pod.a", "added", "")
    assert order.admit("pod.a", "deleted", "")
    assert order.admit("pod.a", "added", "")


def test_tombstones_of_many_distinct_names_stay_bounded() -> None:
    order = VersionOrder(tombstone_limit=1000)
    for index in range(100_000):
        key = f"pod.ns.name-{index}"
        order.admit(key, "added", str(2 * index + 1))
        order.admit(key, "deleted", str(2 * index + 2))
    assert len(order.tombstones) == 1000 and order.live == {}
    # The most recent deletions are the ones remembered.
    assert not order.admit("pod.ns.name-99999", "added", "5")


def test_a_flood_of_deletions_never_forgets_a_live_object() -> None:
    """Only tombstones are bounded, the oldest first; a live object's version stays, so an
    older change of it is still dropped after the flood."""
    order = VersionOrder(tombstone_limit=10)
    assert order.admit("pod.ns.live", "added", "5")
    for index in range(1000):
        key = f"pod.ns.gone-{index}"
        order.admit(key, "added", str(10 + 2 * index))
        order.admit(key, "deleted", str(11 + 2 * index))
    assert order.live == {"pod.ns.live": 5}
    assert list(order.tombstones) == [f"pod.ns.gone-{index}" for index in range(990, 1000)]
    assert not order.admit("pod.ns.live", "modified", "4")
