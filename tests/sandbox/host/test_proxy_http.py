"""Parsing proxy requests (`sandbox/host/proxy_http.py`): the two accepted forms, and refusals."""

from __future__ import annotations

import pytest
from stockade.sandbox.host.proxy_http import BadRequest, denial, parse_head


def test_connect_and_absolute_form() -> None:
    tunnel = parse_head(b"CONNECT api.github.com:443 HTTP/1.1\r\nHost: api.github.com:443\r\n\r\n")
    assert (tunnel.tunnel, tunnel.host, tunnel.port) == (True, "api.github.com", 443)
    v6 = parse_head(b"CONNECT [::1]:8443 HTTP/1.1\r\n\r\n")
    assert (v6.host, v6.port) == ("[::1]", 8443)
    plain = parse_head(
        b"GET http://example.org/a?b=1 HTTP/1.1\r\nHost: example.org\r\nProxy-Connection: keep-alive\r\n"
        b"Proxy-Authorization: Basic eA==\r\nConnection: keep-alive\r\nAccept: */*\r\n\r\n"
    )
    assert (plain.tunnel, plain.host, plain.port) == (False, "example.org", 80)
    assert plain.upstream_head == (
        b"GET /a?b=1 HTTP/1.1\r\nHost: example.org\r\nAccept: */*\r\nConnection: close\r\n\r\n"
    )


@pytest.mark.parametrize(
    "head",
    [
        b"GET /relative HTTP/1.1\r\n\r\n",
        b"GET https://example.org/ HTTP/1.1\r\n\r\n",
        b"GET http://user:pw@example.org/ HTTP/1.1\r\n\r\n",
        b"CONNECT example.org HTTP/1.1\r\n\r\n",
        b"CONNECT example.org:99999 HTTP/1.1\r\n\r\n",
        b"\x16\x03\x01 TLS hello\r\n\r\n",
        b"GET http://example.org/ HTTP/2\r\n\r\n",
    ],
)
def test_other_requests_are_refused(head: bytes) -> None:
    with pytest.raises(BadRequest):
        parse_head(head)


def test_denial_is_a_403_with_a_printable_reason() -> None:
    response = denial("evil\r\nSet-Cookie: x is not on the allowlist")
    status, _, rest = response.partition(b"\r\n")
    assert status == b"HTTP/1.1 403 Forbidden by stockade: evil??Set-Cookie: x is not on the allowlist"
    assert b"\r\nSet-Cookie" not in rest
