"""Network tools for the egress allowlist tests. Imported only inside workers."""

from __future__ import annotations

import http.client
import json
import os
import socket
import ssl
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

from stockade.tools.base import tool

TIMEOUT_S = 10


def _context(cadata: str) -> ssl.SSLContext | None:
    return ssl.create_default_context(cadata=cadata) if cadata else None


def _fetch_one(url: str, cadata: str) -> dict[str, object]:
    try:
        with urllib.request.urlopen(url, timeout=TIMEOUT_S, context=_context(cadata)) as response:
            body = response.read()
            return {"status": response.status, "len": len(body), "body": body[:2000].decode(errors="replace")}
    except urllib.error.HTTPError as exc:
        return {"status": exc.code, "reason": str(exc.reason), "body": exc.read().decode(errors="replace")}
    except (OSError, ValueError, http.client.HTTPException) as exc:
        return {"error": str(exc)}


@tool
def fetch(urls: list[str], cadata: str = "") -> str:
    """GET each URL with the standard library (proxy from the environment); JSON list of results."""
    return json.dumps([_fetch_one(url, cadata) for url in urls])


@tool
def slow_read(url: str, seconds: float) -> str:
    """Read `url` 64 KiB at a time, pausing between reads, for `seconds`; returns the bytes read."""
    done, deadline = 0, time.monotonic() + seconds
    with urllib.request.urlopen(url, timeout=TIMEOUT_S) as response:
        while time.monotonic() < deadline and (chunk := response.read(64 << 10)):
            done += len(chunk)
            time.sleep(0.05)
    return str(done)


@tool
def httpx_get(url: str, cadata: str = "") -> str:
    """GET `url` with httpx (which reads the proxy variables itself); JSON status and body."""
    import httpx

    context = _context(cadata)
    verify: ssl.SSLContext | bool = context if context is not None else True
    response = httpx.get(url, verify=verify, timeout=TIMEOUT_S)
    return json.dumps({"status": response.status_code, "body": response.text[:2000]})


@tool
def curl(url: str, cadata: str = "") -> str:
    """GET `url` with the curl binary; JSON with its exit code, stdout and stderr."""
    argv = ["curl", "-sS", "--max-time", str(TIMEOUT_S), url]
    if cadata:
        with open("ca.pem", "w", encoding="ascii") as handle:
            handle.write(cadata)
        argv[1:1] = ["--cacert", "ca.pem"]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=TIMEOUT_S + 5, check=False)
    return json.dumps({"rc": done.returncode, "out": done.stdout, "err": done.stderr})


@tool
def raw_connect(host: str, port: int) -> str:
    """A plain TCP connect that ignores the proxy variables: "connected" or the error."""
    try:
        with socket.create_connection((host, port), timeout=3):
            return "connected"
    except OSError as exc:
        return f"error: {exc}"


@tool
def bad_handovers() -> str:
    """Talk to the proxy's unix socket directly, handing over junk: no fd, a file, a datagram
    socket, two sockets, and a connection that never sends its request. Returns what it managed."""
    path = next(str(p) for p in Path.cwd().glob(".stockade-proxy-*.sock"))
    udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    pair = socket.socketpair()
    attempts: list[list[int]] = [
        [],
        [os.open("/dev/null", os.O_RDONLY)],
        [udp.fileno()],
        [p.fileno() for p in pair],
    ]
    for fds in attempts:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as proxy:
            proxy.connect(path)
            socket.send_fds(proxy, [b"x"], fds)
    silent = socket.socketpair()
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as proxy:
        proxy.connect(path)
        socket.send_fds(proxy, [b"x"], [silent[1].fileno()])
    return f"sent {len(attempts) + 1} handovers"


_held: list[socket.socket] = []


@tool
def held_tunnel(step: str, port: int = 0) -> str:
    """One tool for both steps, so they run in the same worker (a warm worker serves one tool).

    `open`: open a CONNECT tunnel to `port` through the proxy and keep it (in this worker) past the
    call's end; its status line. `state`: what that tunnel says now, "closed" once the proxy dropped it.
    """
    if step == "open":
        proxy_port = int(os.environ["http_proxy"].rsplit(":", 1)[1])
        sock = socket.create_connection(("127.0.0.1", proxy_port), timeout=5)
        sock.sendall(f"CONNECT 127.0.0.1:{port} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\r\n".encode())
        _held.append(sock)
        return sock.recv(100).decode(errors="replace").split("\r\n")[0]
    sock = _held.pop()
    sock.settimeout(5)
    try:
        return "closed" if sock.recv(100) == b"" else "open"
    except TimeoutError:
        return "open"
    except OSError as exc:
        return f"closed ({exc})"


@tool
def proxy_env() -> str:
    """The proxy variables the tool sees, as JSON."""
    names = ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "NO_PROXY")
    return json.dumps({n: os.environ.get(n) for name in names for n in (name, name.lower())})


TOOLS = [
    fetch,
    slow_read,
    httpx_get,
    curl,
    raw_connect,
    bad_handovers,
    held_tunnel,
    proxy_env,
]
