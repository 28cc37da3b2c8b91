"""The quota lent to a Kueue ClusterQueue, and which admitted workloads give serving its room."""

from __future__ import annotations

import pytest

from tideshift.services.cluster.adapters.kueue_queues import KueueQuotaError, read_queue
from tideshift.services.cluster.core.kueue_quota import (
    LEND_QUOTA_LABEL,
    Admitted,
    Amount,
    QuotaConfig,
    QuotaInputs,
    lendable,
    next_quota,
    quantity,
    share,
    to_deactivate,
    to_reactivate,
)

GI = 2.0**30
CAP = Amount(16, 64 * GI)


def inputs(lead: float, must: float, minimum: float = 0.0, other: float = 0.0) -> QuotaInputs:
    return QuotaInputs(
        capacity=CAP,
        serving_lead=Amount(lead, lead * GI),
        serving_must=Amount(must, must * GI),
        other=Amount(other, other * GI),
        admitted_minimum=Amount(minimum, minimum * GI),
    )


def test_quota_is_what_serving_will_not_need_within_the_lead_time() -> None:
    quota, why = lendable(inputs(lead=10, must=4, other=2))
    assert quota == Amount(4, 52 * GI)
    assert "lead time" in why


def test_admitted_gang_minimums_hold_unless_serving_needs_the_room_now() -> None:
    # The reservation (a high quantile) wants 14 of 16, the expected need 4: the 6 cores of
    # minimums stay.
    assert lendable(inputs(lead=14, must=4, minimum=6))[0].cpu == 6
    # Serving is expected to need 13: only 3 are left, the minimums are cut to them.
    assert lendable(inputs(lead=14, must=13, minimum=6))[0].cpu == 3
    # Never negative.
    assert lendable(inputs(lead=20, must=20, minimum=6))[0].cpu == 0


def test_growth_is_rate_limited_and_a_shrink_for_serving_is_not() -> None:
    config = QuotaConfig(min_interval_s=300)
    first = next_quota(inputs(lead=10, must=4), None, None, 0.0, config)
    assert first.changed and first.quota.cpu == 6
    grow = next_quota(inputs(lead=4, must=4), first.quota, 0.0, 100.0, config)
    assert not grow.changed and grow.quota == first.quota and "growth in 200s" in grow.reason
    later = next_quota(inputs(lead=4, must=4), first.quota, 0.0, 300.0, config)
    assert later.changed and later.quota.cpu == 12
    shrink = next_quota(inputs(lead=14, must=4), later.quota, 300.0, 301.0, config)
    assert shrink.changed and shrink.quota.cpu == 2
    same = next_quota(inputs(lead=14.1, must=4), shrink.quota, 300.0, 302.0, config)
    assert not same.changed


def test_evictions_follow_kueue_order_and_come_back_when_there_is_room() -> None:
    one = Amount(1, GI)
    workloads = [
        Admitted("high-old", 10, 0.0, one.scaled(2)),
        Admitted("low-old", 0, 0.0, one.scaled(2)),
        Admitted("low-new", 0, 5.0, one.scaled(2)),
    ]
    assert to_deactivate(workloads, one.scaled(6)) == []
    assert to_deactivate(workloads, one.scaled(4)) == ["low-new"]
    assert to_deactivate(workloads, one.scaled(1)) == ["low-new", "low-old", "high-old"]
    gone = [
        workloads[0],
        Admitted("low-old", 0, 0.0, one.scaled(2), deactivated_by_us=True),
        Admitted("low-new", 0, 5.0, one.scaled(2), deactivated_by_us=True),
    ]
    assert to_reactivate(gone, one.scaled(4)) == ["low-old"]
    assert to_reactivate(gone, one.scaled(9)) == ["low-old", "low-new"]


def test_quantities_and_shares() -> None:
    assert (quantity("cpu", 1.2345), quantity("memory", 3 * GI), quantity("x", 2.7)) == (
        "1234m",
        "3072Mi",
        "2",
    )
    split = share(Amount(6, 0), ["a", "b"], {"a": 2})
    assert (split["a"].cpu, split["b"].cpu) == (4, 2)


def cluster_queue(label: str | None, resources: list[dict[str, str]]) -> dict[str, object]:
    labels = {LEND_QUOTA_LABEL: label} if label is not None else {}
    return {
        "metadata": {"name": "cq", "labels": labels, "resourceVersion": "7"},
        "spec": {"resourceGroups": [{"flavors": [{"name": "f", "resources": resources}]}]},
    }


def test_a_lent_queue_is_read_from_its_flavor() -> None:
    queue = read_queue(
        cluster_queue(
            "f",
            [{"name": "cpu", "nominalQuota": "1500m"}, {"name": "memory", "nominalQuota": "2Gi"}],
        )
    )
    assert (queue.quota, queue.covered) == (Amount(1.5, 2 * GI), ("cpu", "memory"))


@pytest.mark.parametrize(
    ("label", "resources", "says"),
    [
        ("g", [{"name": "cpu", "nominalQuota": "1"}], "names no flavor"),
        ("", [{"name": "cpu", "nominalQuota": "1"}], "is empty"),
        ("f", [{"name": "memory", "nominalQuota": "1Gi"}], "has no cpu"),
        ("f", [{"name": "cpu", "nominalQuota": "lots"}], "flavor 'f'"),
    ],
)
def test_a_queue_that_cannot_be_lent_says_which_field(
    label: str, resources: list[dict[str, str]], says: str
) -> None:
    with pytest.raises(KueueQuotaError, match=says) as caught:
        read_queue(cluster_queue(label, resources))
    assert "ClusterQueue cq" in str(caught.value)
