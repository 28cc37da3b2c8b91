"""`tideshift run trainer --job NAME`: the built-in example trainer, a logistic regression
on the synthetic click log (core/model.py), written on the public SDK like any user's loop.

The job's dataset must be `clicks://` URIs (model.dataset_uris); see
docs/guides/elastic-training.md for the same loop with a PaddlePaddle model. Exits 0 when the
job finishes or after SIGTERM (the current batch finishes within --grace-seconds, the rest of
the shard goes back to the queue).

Its `/healthz`, `/readyz` and `/metrics` (TrainerHealth) run on a stdlib HTTP server in a
daemon thread: the loop is synchronous SDK code, not a `runtime` service body. They are up
before the SDK waits for its coordinator: the pod is alive while it waits and ready only once
it holds the model.
"""

from __future__ import annotations

import logging
import sys
import threading
import time
from collections.abc import Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from pydantic import Field

from tideshift.services.common.runtime import configure_logging
from tideshift.services.common.settings import ServiceSettings, parse_settings
from tideshift.services.trainer.core.model import (
    ShardData,
    gradients,
    initial_state,
    parse_uri,
    read_uri,
)
from tideshift.services.trainer.sdk import ElasticJob

log = logging.getLogger("tideshift.trainer")


class TrainerSettings(ServiceSettings):
    """Example elastic trainer: logistic regression on the synthetic click log."""

    job: str = Field(min_length=1, max_length=253, description="training job name")
    grace_seconds: float = Field(
        default=10.0,
        gt=0,
        le=18,
        description="on SIGTERM, finish the current batch within this many seconds",
    )
    min_task_seconds: float = Field(
        default=0.0,
        ge=0,
        description="hold each shard at least this long (emulates a heavier model in demos)",
    )
    # Off unless asked: trainers run many to a machine outside a cluster (examples, tests,
    # benchmarks) and would collide on one fixed port; a trainer pod sets its own.
    health_port: int = Field(
        default=-1,
        ge=-1,
        le=65535,
        description="port of /healthz, /readyz, /metrics; 0 = any, -1 = off (the default)",
    )


def read_batches(location: str) -> list[ShardData]:
    spec, _ = parse_uri(location)
    return read_uri(location).batches(spec.batch_size)


def train(settings: TrainerSettings, health: TrainerHealth | None = None) -> dict[str, int]:
    job = ElasticJob.connect(
        settings.job,
        nats_url=settings.nats_url,
        trainer=settings.instance or None,
        grace_seconds=settings.grace_seconds,
    )
    with job:
        spec, _ = parse_uri(job.spec.shards[0])
        if health is not None:
            health.not_ready = "waiting for the model to be initialised"
        job.initialize(initial_state(spec.model))
        if health is not None:
            health.not_ready = ""
        for task in job.tasks():
            for batch in task.batches(read_batches):
                # Demos emulate a heavier model: each batch takes its share of the shard's time.
                time.sleep(settings.min_task_seconds * batch.num_samples / spec.samples_per_shard)
                params = task.pull()
                task.push(gradients(params, batch, l2=spec.model.l2), samples=batch.num_samples)
        log.info(
            "job %s: trainer %s left after %d applied batches",
            settings.job,
            job.trainer,
            job.applied_batches,
        )
        return {"batches": job.applied_batches, "samples": job.applied_samples}


def main(argv: Sequence[str]) -> int:
    settings = parse_settings(TrainerSettings, argv, prog="tideshift run trainer")
    configure_logging(settings.log_level)
    if settings.nats_url is None:
        print(
            "tideshift run trainer: --nats-url (env TIDESHIFT_NATS_URL) is required",
            file=sys.stderr,
        )
        return 2
    health = TrainerHealth()
    try:
        if settings.health_port >= 0:
            health.serve(settings.health_host, settings.health_port)
        train(settings, health)
    except (ValueError, TimeoutError, ConnectionError, OSError) as error:
        print(f"tideshift run trainer: {error}", file=sys.stderr)
        return 1
    finally:
        health.stop()
    return 0


class TrainerHealth:
    """Why the trainer is not ready (empty once it is); `serve` starts the endpoints."""

    def __init__(self) -> None:
        self.not_ready = "waiting for the job spec"
        self.server: ThreadingHTTPServer | None = None

    @property
    def port(self) -> int | None:
        return None if self.server is None else int(self.server.server_address[1])

    def serve(self, host: str, port: int) -> None:
        health = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # the stdlib calls it by this name
                status, kind, body = health.answer(self.path)
                self.send_response(status)
                self.send_header("Content-Type", kind)
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass  # probes every few seconds would drown the trainer's own log

        self.server = ThreadingHTTPServer((host, port), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True, name="health").start()
        log.info("trainer health and metrics on %s:%s", host, self.port)

    def answer(self, path: str) -> tuple[int, str, bytes]:
        if path == "/healthz":
            return 200, "text/plain", b"ok\n"
        if path == "/readyz":
            if self.not_ready:
                return 503, "text/plain", f"not ready: {self.not_ready}\n".encode()
            return 200, "text/plain", b"ready\n"
        if path == "/metrics":
            return 200, CONTENT_TYPE_LATEST, generate_latest()
        return 404, "text/plain", b"not found\n"

    def stop(self) -> None:
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()
