"""The test process's way to the real cluster's apiserver: a loopback-only port on the host.

Binds 127.0.0.1:<port> in the namespace it starts in (the host's), then moves itself into the
cluster's network namespace and forwards every accepted connection to the apiserver there. A
socket keeps the namespace it was created in, so the listener stays on the host's loopback while
every outgoing connection is made inside the cluster's namespace: nothing on the host's network
is configured, and nothing listens beyond loopback.

    python3 apiforward.py --netns /run/netns/tsr-cp --target 10.250.0.1:6443 --port-file F
"""

from __future__ import annotations

import argparse
import asyncio
import ctypes
import os
import socket
from pathlib import Path

CLONE_NEWNET = 0x40000000
CHUNK = 65536


def enter_netns(path: str) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    fd = os.open(path, os.O_RDONLY)
    try:
        if libc.setns(fd, CLONE_NEWNET) != 0:
            errno = ctypes.get_errno()
            raise OSError(errno, f"setns({path}): {os.strerror(errno)}")
    finally:
        os.close(fd)


async def pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(CHUNK):
            writer.write(data)
            await writer.drain()
    except (ConnectionError, OSError):
        pass
    finally:
        writer.close()


async def serve(listener: socket.socket, host: str, port: int) -> None:
    async def handle(client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        try:
            server_r, server_w = await asyncio.open_connection(host, port)
        except OSError:
            client_w.close()
            return
        await asyncio.gather(pipe(client_r, server_w), pipe(server_r, client_w))

    server = await asyncio.start_server(handle, sock=listener)
    async with server:
        await server.serve_forever()


def host_port(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise argparse.ArgumentTypeError(f"expected host:port (port 1-65535), got {text!r}")
    return host, int(port)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--netns", required=True)
    parser.add_argument(
        "--target", required=True, type=host_port, help="host:port inside the namespace"
    )
    parser.add_argument("--port", type=int, default=0, help="loopback port (0: any free one)")
    parser.add_argument("--port-file", required=True)
    args = parser.parse_args()

    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", args.port))
    listener.listen(128)
    enter_netns(args.netns)
    tmp = Path(args.port_file + ".tmp")
    tmp.write_text(f"{listener.getsockname()[1]}\n")
    tmp.rename(args.port_file)
    asyncio.run(serve(listener, *args.target))


if __name__ == "__main__":
    main()
