"""Post to a chat webhook whenever Tideshift scales a serving workload up.

A custom reaction written against the `events` subscription API (NATS). It listens to scale
results, which say what an executor actually did (previous and current replicas), and posts
one line per scale-up of a serving kind as `{"text": ...}`, the body Slack, Mattermost and
Rocket.Chat incoming webhooks accept.

    python examples/reactions/chat_webhook.py \
        --nats-url nats://127.0.0.1:4222 --webhook-url https://chat.example/hooks/abc

Every option also reads an environment variable (TIDESHIFT_NATS_URL,
TIDESHIFT_NATS_CREDENTIALS, WEBHOOK_URL, REACTION_NAMESPACE, REACTION_KINDS), which is how
the Helm chart's `reactions` hook runs it.
A webhook that fails is logged and skipped: the reaction keeps listening.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import signal
import sys
from collections.abc import Coroutine, Sequence
from typing import Any

import aiohttp

from tideshift.events import SCALE_RESULT, ScaleResult
from tideshift.events.client import EventClient

log = logging.getLogger("reaction.chat_webhook")
SERVING_KINDS = ("Deployment.apps", "StatefulSet.apps")


def scale_up_text(result: ScaleResult, *, kinds: Sequence[str] = SERVING_KINDS) -> str | None:
    """The chat line for an applied scale-up of a serving kind; None for anything else."""
    if result.outcome != "applied" or result.target.kind not in kinds:
        return None
    if result.previous is None or result.current is None or result.current <= result.previous:
        return None
    target = result.target
    return (
        f":arrow_up: {target.kind} {target.namespace}/{target.name} scaled up "
        f"{result.previous} → {result.current} replicas"
        + (f" ({result.message})" if result.message else "")
    )


async def post_text(session: aiohttp.ClientSession, url: str, text: str) -> bool:
    """Post one line; False (logged) when the webhook is unreachable or answers an error."""
    try:
        async with session.post(url, json={"text": text}) as response:
            if response.status >= 300:
                log.warning("webhook answered %s: %s", response.status, await response.text())
                return False
    except (aiohttp.ClientError, TimeoutError) as error:
        log.warning("webhook %s unreachable: %s", url, error)
        return False
    return True


async def run(
    nats_url: str,
    webhook_url: str,
    *,
    namespace: str | None,
    kinds: Sequence[str],
    credentials: str | None = None,
) -> None:
    subject = SCALE_RESULT.filter(namespace=namespace) if namespace else SCALE_RESULT.filter()
    timeout = aiohttp.ClientTimeout(total=10)
    async with (
        aiohttp.ClientSession(timeout=timeout) as session,
        await EventClient.connect(
            nats_url, name="reaction-chat-webhook", credentials=credentials
        ) as client,
    ):
        log.info("listening on %s, posting scale-ups to %s", subject, webhook_url)
        async for event in client.subscribe(subject):
            text = scale_up_text(event.data, kinds=kinds)
            if text is not None:
                await post_text(session, webhook_url, text)


async def until_terminated(body: Coroutine[Any, Any, None]) -> None:
    """Run `body` until it ends or SIGTERM arrives (a pod being stopped), then return."""
    task = asyncio.create_task(body)
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, task.cancel)
    with contextlib.suppress(asyncio.CancelledError):
        await task


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--nats-url", default=os.environ.get("TIDESHIFT_NATS_URL", "nats://127.0.0.1:4222")
    )
    parser.add_argument(
        "--nats-credentials",
        default=os.environ.get("TIDESHIFT_NATS_CREDENTIALS") or None,
        help="NATS .creds file (default: none)",
    )
    parser.add_argument("--webhook-url", default=os.environ.get("WEBHOOK_URL"))
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
    if not args.webhook_url or not args.webhook_url.startswith(("http://", "https://")):
        parser.error("--webhook-url (or WEBHOOK_URL) must be an http:// or https:// URL")
    kinds = [kind.strip() for kind in args.kinds.split(",") if kind.strip()]
    if not kinds:
        parser.error("--kinds must name at least one kind, e.g. Deployment.apps")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    try:
        asyncio.run(
            until_terminated(
                run(
                    args.nats_url,
                    args.webhook_url,
                    namespace=args.namespace,
                    kinds=kinds,
                    credentials=args.nats_credentials,
                )
            )
        )
    except KeyboardInterrupt:
        return 0
    except ConnectionError as error:
        print(f"chat_webhook: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
