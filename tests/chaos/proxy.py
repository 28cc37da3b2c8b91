"""A loopback TCP relay in front of nats-server for one process.

Its client-to-server direction can be held: the process keeps reading but nothing it sends
arrives, so a chaos test can let an executor write to the apiserver and kill it before its ack
reaches NATS. A relay made `gated` reaches the server only once opened: a standby process can
start (and pay for its imports) while it waits on its connection."""

from __future__ import annotations

import contextlib
import socket
import threading
from types import TracebackType


class HoldableRelay:
    def __init__(self, upstream_port: int, *, gated: bool = False, host: str = "127.0.0.1") -> None:
        self.upstream = (host, upstream_port)
        self._gate = threading.Event()
        if not gated:
            self._gate.set()
        self._listener = socket.create_server((host, 0))
        self.port = int(self._listener.getsockname()[1])
        self._outbound_open = threading.Event()
        self._outbound_open.set()
        self._closed = threading.Event()
        self._sockets: list[socket.socket] = []
        self._lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def url(self) -> str:
        return f"nats://{self.upstream[0]}:{self.port}"

    def hold_outbound(self) -> None:
        self._outbound_open.clear()

    def open(self) -> None:
        self._gate.set()

    def _accept(self) -> None:
        while not self._closed.is_set():
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            with self._lock:
                self._sockets.append(client)
            threading.Thread(target=self._connect, args=(client,), daemon=True).start()

    def _connect(self, client: socket.socket) -> None:
        while not self._gate.wait(0.05):
            if self._closed.is_set():
                return
        try:
            server = socket.create_connection(self.upstream)
        except OSError:
            client.close()
            return
        with self._lock:
            self._sockets.append(server)
        threading.Thread(target=self._pump, args=(client, server, True), daemon=True).start()
        threading.Thread(target=self._pump, args=(server, client, False), daemon=True).start()

    def _pump(self, source: socket.socket, sink: socket.socket, outbound: bool) -> None:
        with contextlib.suppress(OSError):
            while True:
                chunk = source.recv(65536)
                if not chunk:
                    break
                if outbound:
                    # Held: the bytes are kept back until the relay closes (then dropped).
                    while not self._outbound_open.wait(0.05):
                        if self._closed.is_set():
                            return
                sink.sendall(chunk)
        with contextlib.suppress(OSError):
            sink.shutdown(socket.SHUT_WR)

    def close(self) -> None:
        self._closed.set()
        with contextlib.suppress(OSError):
            self._listener.close()
        with self._lock:
            for sock in self._sockets:
                with contextlib.suppress(OSError):
                    sock.close()

    def __enter__(self) -> HoldableRelay:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()
