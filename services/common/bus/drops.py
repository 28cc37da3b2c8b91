"""A connection's core-NATS subscribers: how many messages each has waiting (its backlog: a
truthful "behind", whatever the producers' clocks say), and the messages one lost because it
fell behind (nats-py's "slow consumer"): counted per consumer, logged at most once a minute
per consumer, and handed to the subscriber's own callback so it can repair what it missed
(the planner reads its snapshot again at once). Imports nats only for its types."""

from __future__ import annotations

import logging
import time
import weakref
from collections import Counter as Tally
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import nats.errors
from nats.aio.subscription import Subscription
from prometheus_client import REGISTRY, Counter
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

log = logging.getLogger("tideshift.bus")

DROPPED = Counter(
    "tideshift_bus_dropped_total",
    "Core NATS messages dropped because the subscriber fell behind (its buffer was full)",
    ["consumer"],
)
# One warning per consumer per minute: a flood drops thousands a second, and a warning for
# each would cost the very loop that fell behind.
LOG_EVERY_S = 60.0


@dataclass
class _Subscriber:
    consumer: str
    on_drop: Callable[[], None] | None
    waiting: Callable[[], int]  # messages taken from the server, not yet handed over
    logged_at: float = float("-inf")
    unlogged: int = 0


@dataclass(eq=False)  # hashable by identity: the backlog gauge holds each weakly
class SlowConsumers:
    """The connection's subscriptions, to name whoever a slow-consumer error is about."""

    _by_subscription: dict[Subscription, _Subscriber] = field(default_factory=dict)

    def __post_init__(self) -> None:
        _LIVE.add(self)

    def register(
        self,
        subscription: Subscription,
        consumer: str,
        on_drop: Callable[[], None] | None,
        waiting: Callable[[], int],
    ) -> None:
        self._by_subscription[subscription] = _Subscriber(consumer, on_drop, waiting)

    def backlogs(self) -> Tally[str]:
        """Messages waiting per consumer, over all subscriptions on this connection."""
        waiting: Tally[str] = Tally()
        for subscription, subscriber in self._by_subscription.items():
            waiting[subscriber.consumer] += subscription.pending_msgs + subscriber.waiting()
        return waiting

    def backlog(self, consumer: str) -> int:
        """Messages waiting for `consumer`, over all its subscriptions on this connection."""
        return self.backlogs()[consumer]

    def forget(self, subscription: Subscription) -> None:
        self._by_subscription.pop(subscription, None)

    def __len__(self) -> int:
        return len(self._by_subscription)

    def report(self, error: nats.errors.SlowConsumerError) -> None:
        """One dropped message: count it, tell its subscriber, warn now and then."""
        subscriber = self._by_subscription.get(error.sub)
        if subscriber is None:  # a subscription made outside `Bus.subscribe`
            DROPPED.labels("unknown").inc()
            return
        DROPPED.labels(subscriber.consumer).inc()
        subscriber.unlogged += 1
        now = time.monotonic()
        if now - subscriber.logged_at >= LOG_EVERY_S:
            log.warning(
                "%s fell behind on %s: %d message(s) dropped since the last warning",
                subscriber.consumer,
                error.subject,
                subscriber.unlogged,
            )
            subscriber.logged_at, subscriber.unlogged = now, 0
        if subscriber.on_drop is not None:
            subscriber.on_drop()


# Every connection's registry in this process, for the backlog gauge (weakly: a closed
# connection's subscribers drop out with it).
_LIVE: weakref.WeakSet[SlowConsumers] = weakref.WeakSet()


class _BacklogCollector(Collector):
    """`tideshift_bus_backlog{consumer}`, read at scrape time: how far behind each consumer
    is (a flood's backlog is memory the service holds until it has applied it)."""

    def collect(self) -> Iterator[GaugeMetricFamily]:
        family = GaugeMetricFamily(
            "tideshift_bus_backlog",
            "Core NATS messages waiting to be handed to each consumer's handler",
            labels=["consumer"],
        )
        waiting: Tally[str] = Tally()
        for consumers in list(_LIVE):
            waiting.update(consumers.backlogs())
        for consumer, count in sorted(waiting.items()):
            family.add_metric([consumer], count)
        yield family


REGISTRY.register(_BacklogCollector())
