"""The custom-reaction examples run as users run them (a separate process) against a real
nats-server: the NATS one posts scale-ups to a chat webhook, the MQTT one prints them."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import pytest
from aiohttp import web

from tideshift import events
from tideshift.services.common.bus import Bus
from tideshift.services.common.embedded_nats import EmbeddedNats

REPO = Path(__file__).resolve().parents[3]
EXAMPLES = REPO / "examples" / "reactions"
# The scripts import `events` as an installed package would be; point at this checkout so a
# stale editable install cannot shadow it.
SCRIPT_ENV = dict(os.environ)
AT = datetime(2026, 3, 1, 7, 30, tzinfo=UTC)
WAIT = 20.0


def result(
    namespace: str,
    *,
    kind: str = "Deployment",
    name: str = "web",
    previous: int | None = 2,
    current: int | None = 5,
    outcome: str = "applied",
) -> events.ScaleResult:
    return events.ScaleResult(
        target=events.WorkloadRef(kind=kind, namespace=namespace, name=name),
        idempotency_key=f"{namespace}-{name}-{previous}-{current}",
        outcome=outcome,  # type: ignore[arg-type]
        previous=previous,
        current=current,
        desired=current or 0,
        executed_at=AT,
        executor="executor-0",
    )


async def publish_result(bus: Bus, data: events.ScaleResult) -> None:
    target = data.target
    subject = events.SCALE_RESULT.at(namespace=target.namespace, kind=target.kind, name=target.name)
    await bus.publish_durable(subject, data)


async def publish_noise(bus: Bus, namespace: str) -> None:
    """Everything a scale-up reaction must ignore: downs, training, no-ops, garbage."""
    await publish_result(bus, result(namespace, previous=5, current=2))
    await publish_result(bus, result(namespace, kind="Job", name="train", previous=1, current=8))
    await publish_result(bus, result(namespace, outcome="noop", previous=3, current=3))
    await publish_result(bus, result(namespace, outcome="failed", previous=2, current=None))
    garbage_subject = events.SCALE_RESULT.at(namespace=namespace, kind="Deployment", name="web")
    await bus.connection.publish(garbage_subject.value, b"{not an event")


@dataclass
class ChatWebhook:
    """A local stand-in for a chat service's incoming webhook; fails the first N posts."""

    fail_first: int = 0
    posts: list[dict[str, object]] = field(default_factory=list)
    failures_answered: int = 0
    arrived: asyncio.Event = field(default_factory=asyncio.Event)

    async def handle(self, request: web.Request) -> web.Response:
        body = await request.json()
        if self.failures_answered < self.fail_first:
            self.failures_answered += 1
            return web.Response(status=503, text="chat is down")
        self.posts.append(body)
        self.arrived.set()
        return web.Response(text="ok")


@contextlib.asynccontextmanager
async def serve_webhook(hook: ChatWebhook) -> AsyncIterator[str]:
    app = web.Application()
    app.add_routes([web.post("/hooks/tideshift", hook.handle)])
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        yield f"http://127.0.0.1:{port}/hooks/tideshift"
    finally:
        await runner.cleanup()


@contextlib.asynccontextmanager
async def example_process(script: str, *args: str) -> AsyncIterator[asyncio.subprocess.Process]:
    """Run an example script; on exit, SIGTERM it and check it stops cleanly with code 0."""
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        str(EXAMPLES / script),
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=SCRIPT_ENV,
    )
    try:
        yield process
    finally:
        if process.returncode is None:
            process.send_signal(signal.SIGTERM)
        try:
            code = await asyncio.wait_for(process.wait(), WAIT)
        except TimeoutError:
            process.kill()
            await process.wait()
            pytest.fail(f"{script} ignored SIGTERM")
    assert code == 0, f"{script} exited {code}: {(await process.stderr.read()).decode()}"  # type: ignore[union-attr]


async def publish_until(
    condition: asyncio.Event, publish: Callable[[], Awaitable[None]], *, what: str
) -> None:
    """Core NATS delivers only to live subscribers, and the script subscribes some time after
    it starts: publish a round, wait briefly for the condition, repeat until the deadline."""
    deadline = asyncio.get_running_loop().time() + WAIT
    while not condition.is_set():
        if asyncio.get_running_loop().time() > deadline:
            pytest.fail(f"timed out waiting for {what}")
        await publish()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(condition.wait(), 0.5)


async def test_chat_webhook_example_posts_serving_scale_ups_only(
    nats_server: EmbeddedNats, bus: Bus, unique: str
) -> None:
    hook = ChatWebhook()
    async with (
        serve_webhook(hook) as webhook_url,
        example_process(
            "chat_webhook.py",
            f"--nats-url={nats_server.url}",
            f"--webhook-url={webhook_url}",
            f"--namespace={unique}",
        ),
    ):

        async def round_of_events() -> None:
            await publish_noise(bus, unique)
            await publish_result(bus, result(unique, previous=2, current=5))

        await publish_until(hook.arrived, round_of_events, what="a webhook post")
    # The noise of a round precedes its scale-up, and posts go out in order.
    assert hook.posts[0] == {
        "text": f":arrow_up: Deployment.apps {unique}/web scaled up 2 → 5 replicas"
    }
    assert all("scaled up 2 → 5" in str(post["text"]) for post in hook.posts)


async def test_chat_webhook_example_keeps_listening_when_the_webhook_fails(
    nats_server: EmbeddedNats, bus: Bus, unique: str
) -> None:
    hook = ChatWebhook(fail_first=1)
    async with (
        serve_webhook(hook) as webhook_url,
        example_process(
            "chat_webhook.py",
            f"--nats-url={nats_server.url}",
            f"--webhook-url={webhook_url}",
            f"--namespace={unique}",
        ) as process,
    ):

        async def scale_up() -> None:
            await publish_result(bus, result(unique, name="api", previous=1, current=3))

        await publish_until(hook.arrived, scale_up, what="a post after a failed one")
        assert process.returncode is None, "the reaction died on a webhook error"
    assert hook.failures_answered == 1
    assert (
        hook.posts[0]["text"] == f":arrow_up: Deployment.apps {unique}/api scaled up 1 → 3 replicas"
    )


async def test_chat_webhook_example_rejects_a_missing_webhook_url(
    nats_server: EmbeddedNats,
) -> None:
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        str(EXAMPLES / "chat_webhook.py"),
        f"--nats-url={nats_server.url}",
        "--webhook-url=chat.example/hook",
        stderr=asyncio.subprocess.PIPE,
        env=SCRIPT_ENV,
    )
    _, stderr = await asyncio.wait_for(process.communicate(), WAIT)
    assert process.returncode == 2
    assert "--webhook-url" in stderr.decode()


async def read_line_containing(stream: asyncio.StreamReader, needle: str) -> str:
    async def scan() -> str:
        while line := (await stream.readline()).decode():
            if needle in line:
                return line
        raise AssertionError(f"stream ended before a line containing {needle!r}")

    return await asyncio.wait_for(scan(), WAIT)


async def test_mqtt_example_prints_the_same_scale_ups_through_the_mqtt_listener(
    nats_server: EmbeddedNats, bus: Bus, unique: str
) -> None:
    async with example_process(
        "mqtt_scale_alerts.py",
        f"--mqtt-url=mqtt://127.0.0.1:{nats_server.mqtt_port}",
        f"--namespace={unique}",
    ) as process:
        assert process.stdout is not None and process.stderr is not None
        # The script logs once its SUBACK arrived: from then on nothing published is missed.
        await read_line_containing(process.stderr, "subscribed to")
        await publish_noise(bus, unique)
        await publish_result(bus, result(unique, name="web", previous=4, current=9))
        line = await asyncio.wait_for(process.stdout.readline(), WAIT)
    assert json.loads(line) == {
        "workload": f"Deployment.apps/{unique}/web",
        "previous": 4,
        "current": 9,
        "at": AT.isoformat(),
    }


@pytest.mark.parametrize("bad_url", ["http://127.0.0.1:1883", "mqtt://"])
async def test_mqtt_example_rejects_a_bad_url(bad_url: str) -> None:
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        str(EXAMPLES / "mqtt_scale_alerts.py"),
        f"--mqtt-url={bad_url}",
        stderr=asyncio.subprocess.PIPE,
        env=SCRIPT_ENV,
    )
    _, stderr = await asyncio.wait_for(process.communicate(), WAIT)
    assert process.returncode == 2
    assert "--mqtt-url must look like mqtt://host:1883" in stderr.decode()
