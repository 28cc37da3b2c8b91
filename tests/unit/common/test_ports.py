"""Loopback ports for the servers Tideshift starts: one draw hands out distinct ports, never one
asked for explicitly."""

from __future__ import annotations

import socket

from tideshift.services.common.ports import fill_free_ports, free_ports, port_in_use


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


def test_ports_asked_for_are_kept_and_never_handed_out_again() -> None:
    """The OS may draw a port asked for (nothing listens there yet): it is skipped."""

    def draw(count: int, host: str) -> list[int]:
        return [5000, 5001, 5002][:count]

    assert fill_free_ports([5000, 0, 0], draw=draw) == [5000, 5001, 5002]
    assert fill_free_ports([0, 5001, 0], draw=draw) == [5000, 5001, 5002]
    assert fill_free_ports([7, 8, 9], draw=draw) == [7, 8, 9]


def test_every_zero_gets_a_distinct_free_port() -> None:
    ports = fill_free_ports([0, 0, 0])
    assert len(set(ports)) == 3 and 0 not in ports
