"""Receive the connections a worker's forwarder hands over (SCM_RIGHTS on a unix socket).

The worker's forwarder (`sandbox/child/forward.py`) accepts a tool's TCP connection inside the
worker's network namespace and passes the socket itself over this proxy's unix socket. Each
handover carries one fd, which must be a connected stream socket; anything else (a file, a datagram
socket, no fd at all, more than one) is closed and dropped. At most `max_open` handed-over
connections are served at once, so a tool cannot exhaust the supervisor's descriptors.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import stat
from collections.abc import Awaitable, Callable

__all__ = ["HandoverServer"]

log = logging.getLogger(__name__)

HANDOVER_TIMEOUT_S = 5.0
MAX_OPEN = 256

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


def _stream_socket(fds: list[int]) -> socket.socket | None:
    """The one stream socket among the received `fds`, or None (every fd closed)."""
    sock = None
    for fd in fds:
        try:
            candidate = socket.socket(fileno=fd)
        except OSError:  # not a socket
            os.close(fd)
            continue
        if sock is None and candidate.type == socket.SOCK_STREAM and len(fds) == 1:
            sock = candidate
        else:
            candidate.close()
    return sock


def _open_to_all(path: str) -> None:
    """chmod 0666 the socket at `path` without following a symlink: the folder is the tool's, which
    could swap in a link to a host file between our bind and a plain chmod (run as root)."""
    fd = os.open(path, os.O_PATH | os.O_NOFOLLOW)
    try:
        if not stat.S_ISSOCK(os.fstat(fd).st_mode):
            raise OSError(f"proxy socket {path} was replaced")
        os.chmod(f"/proc/self/fd/{fd}", 0o666)  # the inode we opened, never a link's target
    finally:
        os.close(fd)


class HandoverServer:
    """A unix socket (mode 0666: the worker runs as another uid) whose peers hand over connections."""

    def __init__(self, path: str, handler: Handler, limit: int, max_open: int = MAX_OPEN) -> None:
        self.path = path
        self.handler = handler
        self.limit = limit
        self.max_open = max_open
        self._listener: socket.socket | None = None
        # Owned here: `close` cancels them (synchronous: they end on the loop's next turns).
        self._tasks: set[asyncio.Task[None]] = set()

    def start(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            listener.bind(self.path)
            _open_to_all(self.path)
            listener.listen(128)
            listener.setblocking(False)
        except OSError:
            listener.close()
            raise
        self._listener = listener
        self._spawn(self._accept_loop(listener))

    def _spawn(self, coro: Awaitable[None]) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _accept_loop(self, listener: socket.socket) -> None:
        loop = asyncio.get_running_loop()
        while True:
            try:
                conn, _ = await loop.sock_accept(listener)
            except OSError as exc:
                log.warning("proxy_accept_failed path=%s error=%s", self.path, exc)
                await asyncio.sleep(0.05)
                continue
            if len(self._tasks) > self.max_open:  # the accept loop is one of the tasks
                conn.close()
                continue
            self._spawn(self._receive(conn))

    async def _receive(self, conn: socket.socket) -> None:
        with conn:
            try:
                await asyncio.wait_for(self._readable(conn), HANDOVER_TIMEOUT_S)
                _, fds, _, _ = socket.recv_fds(conn, 16, 1, socket.MSG_DONTWAIT)
            except (OSError, TimeoutError):
                return
        sock = _stream_socket(fds)
        if sock is None:
            return
        try:
            reader, writer = await asyncio.open_connection(sock=sock, limit=self.limit)
        except OSError:
            sock.close()
            return
        await self.handler(reader, writer)

    @staticmethod
    async def _readable(conn: socket.socket) -> None:
        loop = asyncio.get_running_loop()
        ready: asyncio.Future[None] = loop.create_future()

        def wake() -> None:
            if not ready.done():
                ready.set_result(None)

        loop.add_reader(conn.fileno(), wake)
        try:
            await ready
        finally:
            loop.remove_reader(conn.fileno())

    def close(self) -> None:
        """Stop accepting, drop every connection, remove the socket. Idempotent."""
        if self._listener is not None:
            self._listener.close()
            self._listener = None
        for task in list(self._tasks):
            task.cancel()
        with contextlib.suppress(OSError):
            os.unlink(self.path)
