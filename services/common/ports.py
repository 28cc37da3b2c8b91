"""Loopback port helpers for processes Tideshift starts itself."""

from __future__ import annotations

import socket
from collections.abc import Callable, Sequence


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that was free a moment ago (the OS picks it)."""
    return free_ports(1, host)[0]


def free_ports(count: int, host: str = "127.0.0.1") -> list[int]:
    """`count` distinct TCP ports that were free a moment ago: all are bound at once, so the OS
    cannot hand the same one out twice (separate `free_port` calls can, and a server given
    the same port for two listeners exits)."""
    sockets: list[socket.socket] = []
    try:
        for _ in range(count):
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sockets.append(sock)
            sock.bind((host, 0))
        return [int(sock.getsockname()[1]) for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


def fill_free_ports(
    requested: Sequence[int],
    host: str = "127.0.0.1",
    draw: Callable[[int, str], list[int]] = free_ports,
) -> list[int]:
    """`requested` with each 0 replaced by a free port: one draw for all, so the ports given
    are distinct, and none is a port asked for explicitly (the OS may hand one out, since
    nothing listens there yet)."""
    asked = {port for port in requested if port}
    # enough that, once the ports asked for are skipped, every 0 still gets one
    spare = iter(port for port in draw(requested.count(0) + len(asked), host) if port not in asked)
    return [port or next(spare) for port in requested]


def port_in_use(port: int, host: str = "127.0.0.1") -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.settimeout(0.2)
        return sock.connect_ex((host, port)) == 0
