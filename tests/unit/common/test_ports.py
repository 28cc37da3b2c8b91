"""Loopback ports for the servers Tideshift starts: one draw hands out distinct ports."""

from __future__ import annotations

import socket

from tideshift.services.common.ports import free_ports, port_in_use


def test_one_draw_gives_distinct_ports_that_can_be_bound() -> None:
    ports = free_ports(64)
    assert len(set(ports)) == 64
    for port in ports[:4]:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind(("127.0.0.1", port))
            sock.listen()
            assert port_in_use(port)


def test_no_ports_asked_none_given() -> None:
    assert free_ports(0) == []
