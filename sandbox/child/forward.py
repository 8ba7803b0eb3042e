"""The worker's egress forwarder (`network = "allowlist"`): loopback TCP → the proxy's unix socket.

Inside the worker's network namespace only `lo` is up and nothing routes out. The forwarder listens
on `127.0.0.1:<ephemeral>` there and copies each connection, byte for byte, to a fresh connection to
the supervisor's proxy on its unix socket; the proxy decides. It runs as one daemon thread with its
own asyncio loop, started after the isolation layers and before any tool code, and sets the proxy
variables so curl, pip, git, httpx, requests and urllib use it. Stdlib only.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import threading

__all__ = ["PROXY_SOCKET_ENV", "PROXY_VARS", "proxy_environment", "start_forwarder"]

PROXY_SOCKET_ENV = "STOCKADE_PROXY_SOCKET"
"""Where the supervisor's proxy listens (set by `sandbox/host/proxy.py`, same name)."""
CHUNK_BYTES = 64 << 10
PROXY_VARS = ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY")


def proxy_environment(port: int) -> dict[str, str]:
    """The variables that send HTTP(S) clients through the forwarder (both cases: curl reads only
    lowercase `http_proxy`). `NO_PROXY` is emptied: nothing is reachable except through the proxy."""
    url = f"http://127.0.0.1:{port}"
    env = dict.fromkeys(PROXY_VARS, url)
    env["NO_PROXY"] = ""
    return {**env, **{name.lower(): value for name, value in env.items()}}


async def _pump(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
    with contextlib.suppress(OSError):
        while chunk := await src.read(CHUNK_BYTES):
            dst.write(chunk)
            await dst.drain()
        if dst.can_write_eof():
            dst.write_eof()


async def _bridge(path: str, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        up_reader, up_writer = await asyncio.open_unix_connection(path, limit=CHUNK_BYTES)
    except OSError:
        writer.close()
        return
    try:
        await asyncio.gather(_pump(reader, up_writer), _pump(up_reader, writer))
    finally:
        up_writer.close()
        writer.close()


def _serve(listener: socket.socket, path: str, ready: threading.Event) -> None:
    async def main() -> None:
        server = await asyncio.start_server(
            lambda r, w: _bridge(path, r, w), sock=listener, limit=CHUNK_BYTES
        )
        ready.set()
        async with server:
            await server.serve_forever()

    try:
        asyncio.run(main())
    finally:
        ready.set()


def start_forwarder(path: str) -> int:
    """Listen on loopback, forward to the proxy at `path` from a daemon thread; returns the port.
    Raises OSError if loopback is not usable."""
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", 0))
    listener.listen(128)
    listener.set_inheritable(False)  # Programs the tool runs must not hold the listener.
    port = int(listener.getsockname()[1])
    ready = threading.Event()
    threading.Thread(
        target=_serve, args=(listener, path, ready), name="stockade-forwarder", daemon=True
    ).start()
    if not ready.wait(5.0):
        raise OSError("egress forwarder did not start")
    os.environ.update(proxy_environment(port))
    return port
