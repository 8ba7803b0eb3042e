"""The HTTP side of the egress proxy: parse a proxy request head, rewrite it, build denials.

Two request forms are accepted: `CONNECT host:port` (a tunnel, for HTTPS and anything else over
TCP) and an absolute-form `METHOD http://host[:port]/path` (plain HTTP, forwarded with
`Connection: close` so one upstream connection serves one client connection). Anything else is a
400. Stdlib only.
"""

from __future__ import annotations

import re
import urllib.parse
from dataclasses import dataclass

__all__ = ["BadRequest", "ProxyRequest", "denial", "error_response", "parse_head", "printable"]

_HOP_HEADERS = {b"proxy-connection", b"proxy-authorization", b"connection", b"keep-alive"}
_TOKEN = re.compile(rb"^[A-Z]{3,10}$")
_UNSAFE = re.compile(r"[^\x20-\x7e]")


class BadRequest(ValueError):
    """The client's request is not a proxy request this proxy serves."""


@dataclass(frozen=True)
class ProxyRequest:
    """A parsed proxy request: where to, and (absolute form) the head to send upstream."""

    method: str
    host: str
    port: int
    upstream_head: bytes = b""
    """Empty for CONNECT; else the origin-form head with hop-by-hop headers replaced."""

    @property
    def tunnel(self) -> bool:
        return self.method == "CONNECT"


def _authority(text: str, default_port: int | None) -> tuple[str, int]:
    if text.startswith("["):
        host, _, rest = text.partition("]")
        host, port_text = host + "]", rest.removeprefix(":")
    else:
        host, _, port_text = text.rpartition(":") if ":" in text else (text, "", "")
    if not port_text:
        if default_port is None:
            raise BadRequest(f"CONNECT target {text!r} has no port")
        return host, default_port
    if not port_text.isdigit() or not 1 <= int(port_text) <= 65535:
        raise BadRequest(f"bad port in {text!r}")
    return host, int(port_text)


def _origin_head(method: bytes, target: str, version: bytes, headers: list[bytes]) -> tuple[str, int, bytes]:
    url = urllib.parse.urlsplit(target)
    if url.scheme != "http" or not url.netloc or "@" in url.netloc:
        raise BadRequest(f"expected CONNECT or an absolute http:// URL, got {target[:200]!r}")
    host, port = _authority(url.netloc, 80)
    path = (url.path or "/") + (f"?{url.query}" if url.query else "")
    kept = [line for line in headers if line.split(b":", 1)[0].strip().lower() not in _HOP_HEADERS]
    lines = [method + b" " + path.encode() + b" " + version, *kept, b"Connection: close", b"", b""]
    return host, port, b"\r\n".join(lines)


def parse_head(head: bytes) -> ProxyRequest:
    """The request in `head` (everything up to and including the blank line)."""
    lines = head.split(b"\r\n")
    parts = lines[0].split(b" ")
    if len(parts) != 3 or not _TOKEN.match(parts[0]) or not parts[2].startswith(b"HTTP/1."):
        raise BadRequest(f"not an HTTP/1.x request line: {lines[0][:200]!r}")
    method, raw_target, version = parts
    try:
        target = raw_target.decode("ascii")
    except UnicodeDecodeError:
        raise BadRequest("request target is not ASCII") from None
    headers = [line for line in lines[1:] if line]
    if method == b"CONNECT":
        host, port = _authority(target, None)
        return ProxyRequest("CONNECT", host, port)
    host, port, upstream = _origin_head(method, target, version, headers)
    return ProxyRequest(method.decode(), host, port, upstream)


def printable(text: str) -> str:
    """`text` with every non-printable-ASCII character as `?`, cut to 300 characters (for a status
    line, a header or a log line: the tool chose the target name)."""
    return _UNSAFE.sub("?", text)[:300]


def error_response(status: int, phrase: str, message: str, extra: str = "") -> bytes:
    """A complete `Connection: close` response with a plain-text body."""
    body = (printable(message) + "\n").encode()
    head = (
        f"HTTP/1.1 {status} {printable(phrase)}\r\n{extra}Content-Type: text/plain; charset=utf-8\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    )
    return head.encode() + body


def denial(reason: str) -> bytes:
    """The 403 a denied connection gets: the reason in the status phrase (which urllib and pip show),
    in a header, and in the body."""
    why = printable(reason)
    return error_response(
        403,
        f"Forbidden by stockade: {why}",
        f"stockade network denied: {why}",
        f"X-Stockade-Denied: {why}\r\n",
    )
