"""Receive Tideshift scale results over MQTT and print one JSON line per serving scale-up.

The NATS server's MQTT listener maps the subject `tideshift.v1.scale.result.<ns>.<kind>.<name>`
onto the topic `tideshift/v1/scale/result/<ns>/<kind>/<name>`, and events are structured-mode
CloudEvents (every attribute in the JSON body), so any MQTT client (a dashboard, a building
controller, Node-RED) reads the same events as NATS clients. This one uses aiomqtt and the
`events` codec to validate what it receives.

    python examples/reactions/mqtt_scale_alerts.py --mqtt-url mqtt://127.0.0.1:1883
    {"workload": "Deployment.apps/shop/web", "previous": 2, "current": 5, "at": "..."}

It reconnects when the broker goes away; messages that are not valid events are skipped.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import signal
import sys
from collections.abc import Callable, Coroutine, Sequence
from typing import Any
from urllib.parse import urlparse

import aiomqtt

from tideshift.events import SCALE_RESULT, EventRejected, ScaleResult, decode

log = logging.getLogger("reaction.mqtt_scale_alerts")
SERVING_KINDS = ("Deployment.apps", "StatefulSet.apps")
RECONNECT_SECONDS = 2.0


def scale_up_alert(result: ScaleResult, *, kinds: Sequence[str] = SERVING_KINDS) -> str | None:
    """A JSON line for an applied scale-up of a serving kind; None for anything else."""
    if result.outcome != "applied" or result.target.kind not in kinds:
        return None
    if result.previous is None or result.current is None or result.current <= result.previous:
        return None
    return json.dumps(
        {
            "workload": str(result.target),
            "previous": result.previous,
            "current": result.current,
            "at": result.executed_at.isoformat(),
        }
    )


async def watch(
    host: str,
    port: int,
    *,
    namespace: str | None,
    kinds: Sequence[str],
    emit: Callable[[str], None],
    on_subscribed: Callable[[], None] = lambda: None,
) -> None:
    """Emit an alert per scale-up until cancelled, reconnecting after broker failures."""
    subject = SCALE_RESULT.filter(namespace=namespace) if namespace else SCALE_RESULT.filter()
    identifier = f"tideshift-reaction-{os.getpid()}"
    while True:
        try:
            async with aiomqtt.Client(
                host,
                port=port,
                identifier=identifier,
                # The read-only `reaction` login, where the broker requires one (the chart's).
                username=os.environ.get("TIDESHIFT_NATS_USER") or None,
                password=os.environ.get("TIDESHIFT_NATS_PASSWORD") or None,
            ) as client:
                await client.subscribe(subject.mqtt_topic, qos=0)
                log.info("subscribed to %s on %s:%s", subject.mqtt_topic, host, port)
                on_subscribed()
                async for message in client.messages:
                    payload = message.payload if isinstance(message.payload, bytes) else b""
                    try:
                        event = decode(payload, ScaleResult)
                    except EventRejected as error:
                        log.warning("skipped a message on %s: %s", message.topic, error.reason)
                        continue
                    alert = scale_up_alert(event.data, kinds=kinds)
                    if alert is not None:
                        emit(alert)
        except aiomqtt.MqttError as error:
            log.warning(
                "MQTT connection lost (%s); reconnecting in %.0fs", error, RECONNECT_SECONDS
            )
            await asyncio.sleep(RECONNECT_SECONDS)


async def until_terminated(body: Coroutine[Any, Any, None]) -> None:
    """Run `body` until it ends or SIGTERM arrives (a pod being stopped), then return."""
    task = asyncio.create_task(body)
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, task.cancel)
    with contextlib.suppress(asyncio.CancelledError):
        await task


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--mqtt-url", default=os.environ.get("TIDESHIFT_MQTT_URL", "mqtt://127.0.0.1:1883")
    )
    parser.add_argument(
        "--namespace",
        default=os.environ.get("REACTION_NAMESPACE") or None,
        help="only this namespace (default: all)",
    )
    parser.add_argument(
        "--kinds",
        default=os.environ.get("REACTION_KINDS", ",".join(SERVING_KINDS)),
        help="comma-separated serving kinds (default: %(default)s)",
    )
    args = parser.parse_args(argv)
    url = urlparse(args.mqtt_url)
    if url.scheme not in {"mqtt", "tcp"} or not url.hostname:
        parser.error(f"--mqtt-url must look like mqtt://host:1883, got {args.mqtt_url!r}")
    kinds = [kind.strip() for kind in args.kinds.split(",") if kind.strip()]
    if not kinds:
        parser.error("--kinds must name at least one kind, e.g. Deployment.apps")
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s", stream=sys.stderr
    )

    def emit(line: str) -> None:
        print(line, flush=True)

    body = watch(url.hostname, url.port or 1883, namespace=args.namespace, kinds=kinds, emit=emit)
    try:
        asyncio.run(until_terminated(body))
    except KeyboardInterrupt:
        return 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
