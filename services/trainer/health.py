"""`/healthz`, `/readyz` and `/metrics` of the example trainer (`tideshift run trainer`).

The trainer's loop is synchronous SDK code, not a `runtime` service body, so the endpoints run
on a stdlib HTTP server in a daemon thread, up before the SDK waits for its coordinator: the
pod is alive while it waits and ready only once it holds the model.
"""

from __future__ import annotations

import logging
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

log = logging.getLogger("tideshift.trainer")


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
