"""With logins, the provisioner creates the members bucket and the predictor role may keep its
key there: put with a per-key TTL, list, check the bucket, purge."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tideshift.events import PREDICTOR_MEMBERS_BUCKET
from tideshift.services.common.bus import Bus
from tideshift.services.common.embedded_nats import EmbeddedNats
from tideshift.services.predictor.membership import Membership
from tideshift.services.predictor.settings import PredictorSettings


@pytest.fixture(scope="module")
def server() -> Iterator[EmbeddedNats]:
    with EmbeddedNats(auth=True) as running:  # provisioned as it starts
        yield running


async def test_the_predictor_role_keeps_its_membership_key(server: EmbeddedNats) -> None:
    bus = await Bus.connect(
        server.url, name="test-predictor", user="predictor", password=server.passwords["predictor"]
    )
    settings = PredictorSettings(sharded=True, lease_ttl_seconds=2, lease_refresh_seconds=0.5)
    assert settings.members_bucket == PREDICTOR_MEMBERS_BUCKET
    try:
        member = Membership(bus, settings, "p-0")
        await member.open()
        await member.renew()
        assert member.shard.members == {"p-0"} and member.owns("Deployment.apps/shop/web")
        await member.leave()
        await member.renew()  # its own key again, after the purge
        assert member.shard.members == {"p-0"}
    finally:
        await bus.close()
