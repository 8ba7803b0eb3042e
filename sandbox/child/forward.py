"""The worker's egress forwarder (`network = "allowlist"`): loopback TCP → the supervisor's proxy.

Inside the worker's network namespace only `lo` is up and nothing routes out. The forwarder listens
on `127.0.0.1:<ephemeral>` there; for each connection a tool opens, it connects to the proxy's unix
socket and hands the accepted TCP socket itself over (SCM_RIGHTS), then lets go of it. From then on
the supervisor's proxy reads and writes that connection directly and decides where it may go: the
forwarder is out of the data path (no copy in the worker, no buffer a tool could fill). One daemon
thread, started after the isolation layers and before any tool code; it sets the proxy variables
so curl, pip, git, httpx, requests and urllib use it. Stdlib only.
"""

from __future__ import annotations

import contextlib
import errno
import os
import socket
import threading
import time

__all__ = ["PROXY_SOCKET_ENV", "PROXY_VARS", "proxy_environment", "start_forwarder"]

PROXY_SOCKET_ENV = "STOCKADE_PROXY_SOCKET"
"""Where the supervisor's proxy listens (set by `sandbox/host/proxy.py`, same name)."""
PROXY_VARS = ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY")
HANDOVER_TIMEOUT_S = 5.0
_TRANSIENT = {errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM, errno.ECONNABORTED, errno.EINTR}


def proxy_environment(port: int) -> dict[str, str]:
    """The variables that send HTTP(S) clients through the forwarder (both cases: curl reads only
    lowercase `http_proxy`). `NO_PROXY` is emptied: nothing is reachable except through the proxy."""
    url = f"http://127.0.0.1:{port}"
    env = dict.fromkeys(PROXY_VARS, url)
    env["NO_PROXY"] = ""
    return {**env, **{name.lower(): value for name, value in env.items()}}


def _hand_over(conn: socket.socket, path: str) -> None:
    """Pass `conn` to the proxy; the kernel keeps it queued for the proxy even once we close."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as proxy:
        proxy.settimeout(HANDOVER_TIMEOUT_S)
        proxy.connect(path)
        socket.send_fds(proxy, [b"c"], [conn.fileno()])


def _serve(listener: socket.socket, path: str) -> None:
    while True:
        try:
            conn, _ = listener.accept()
        except OSError as exc:
            if exc.errno not in _TRANSIENT:
                return  # the listener is gone (a tool closed it): nothing left to serve
            time.sleep(0.05)  # the tool's own fd or memory limits: wait, keep serving
            continue
        with conn, contextlib.suppress(OSError):
            _hand_over(conn, path)


def start_forwarder(path: str) -> int:
    """Listen on loopback and hand connections to the proxy at `path` from a daemon thread; returns
    the port. Raises OSError if loopback is not usable."""
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.bind(("127.0.0.1", 0))
    listener.listen(128)
    listener.set_inheritable(False)  # Programs the tool runs must not hold the listener.
    port = int(listener.getsockname()[1])
    threading.Thread(target=_serve, args=(listener, path), name="stockade-forwarder", daemon=True).start()
    os.environ.update(proxy_environment(port))
    return port
