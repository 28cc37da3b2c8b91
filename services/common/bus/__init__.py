"""The NATS bus, the only service code that imports `nats`: one face (`Bus`) over the client,
the streams derived from the events' subjects, typed KV and leases, objects and raw RPC, and
`follow` (a subscription kept up with backoff until the stop signal).
Imports the events contract and, of the services, only the clock and retry policies."""

from tideshift.services.common.bus.client import BUS_UNAVAILABLE, Bus
from tideshift.services.common.bus.connect import NatsAuthError
from tideshift.services.common.bus.delivery import Delivery
from tideshift.services.common.bus.follow import RESUBSCRIBE, StreamEnded, follow
from tideshift.services.common.bus.kv import KVConflict, Lease, TypedKV
from tideshift.services.common.bus.rpc import RequestFailed
from tideshift.services.common.bus.streams import (
    DEAD_LETTER_STREAM,
    SCALE_STREAM,
    STREAMS,
    TRAINING_TASK_STREAM,
    StreamSpec,
)

__all__ = [
    "BUS_UNAVAILABLE",
    "DEAD_LETTER_STREAM",
    "RESUBSCRIBE",
    "SCALE_STREAM",
    "STREAMS",
    "TRAINING_TASK_STREAM",
    "Bus",
    "Delivery",
    "KVConflict",
    "Lease",
    "NatsAuthError",
    "RequestFailed",
    "StreamEnded",
    "StreamSpec",
    "TypedKV",
    "follow",
]
