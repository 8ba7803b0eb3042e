"""`network = "allowlist"`: real loopback servers, real workers, the real egress proxy.

Every target is on the host's loopback (or a name the proxy must refuse before any DNS or connect).
A server named exactly by a rule is reached through curl and urllib, over HTTP and HTTPS (CONNECT);
names and ports off the list, a wildcard name that resolves to loopback, the metadata address and a
raw connect that ignores the proxy all fail, and the servers see none of them.
"""

from __future__ import annotations

import asyncio
import contextlib
import http.server
import json
import logging
import shutil
import ssl
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest
from stockade.sandbox import CallRequest, ResourcePolicy, Sandbox, ToolOutcome
from stockade.sandbox.isolation.cage import probe

from .. import sbx_testkit as kit

sandbox_environment = kit.sandbox_environment

REF = "sbx_net:TOOLS"
BODY = "hello from a loopback server"
CHUNK = 1 << 20
FLOOD_BYTES = 64 << 20
pytestmark = pytest.mark.skipif(not probe()["netns"].available, reason="allowlist mode needs the netns layer")


class _Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.server.hits += 1  # type: ignore[attr-defined]
        size = int(self.path.rsplit("/", 1)[1]) if self.path.startswith("/size/") else 0
        self.send_response(200)
        self.send_header("Content-Length", str(size or len(BODY)))
        self.end_headers()
        if not size:
            self.wfile.write(BODY.encode())
        with contextlib.suppress(OSError):  # a reader that stops early
            for start in range(0, size, CHUNK):
                self.wfile.write(b"x" * min(CHUNK, size - start))

    def log_message(self, format: str, *args: object) -> None:
        pass


class Server(http.server.ThreadingHTTPServer):
    daemon_threads = True
    hits = 0

    @property
    def port(self) -> int:
        return int(self.server_address[1])


def _serve(context: ssl.SSLContext | None = None) -> Server:
    server = Server(("127.0.0.1", 0), _Handler)
    if context is not None:
        server.socket = context.wrap_socket(server.socket, server_side=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def _self_signed(folder: Path) -> tuple[Path, Path]:
    if shutil.which("openssl") is None:
        pytest.skip("no openssl binary to make a self-signed certificate")
    cert, key = folder / "cert.pem", folder / "key.pem"
    names = "subjectAltName=IP:127.0.0.1,DNS:localhost"
    argv = [
        "openssl",
        "req",
        "-x509",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-days",
        "1",
        "-subj",
        "/CN=localhost",
    ]
    subprocess.run(
        [*argv, "-addext", names, "-keyout", str(key), "-out", str(cert)],
        check=True,
        capture_output=True,
        timeout=30,
    )
    return cert, key


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """An HTTP server, an HTTPS one (self-signed) and a third HTTP one no rule names."""
    cert, key = _self_signed(tmp_path_factory.mktemp("tls"))
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    found = {"http": _serve(), "https": _serve(context), "other": _serve(), "cadata": cert.read_text()}
    yield found
    for name in ("http", "https", "other"):
        found[name].shutdown()


def _policy(servers: dict[str, Any], **overrides: Any) -> ResourcePolicy:
    rules = [f"127.0.0.1:{servers['http'].port}", f"127.0.0.1:{servers['https'].port}"]
    fields: dict[str, Any] = {"network": "allowlist", "allow_hosts": tuple(rules), **overrides}
    return msgspec.structs.replace(kit.POLICY, wall_timeout_s=30.0, **fields)


def _run(policy: ResourcePolicy, name: str, **input: Any) -> ToolOutcome:
    async def main() -> ToolOutcome:
        async with Sandbox(default=policy) as sandbox:
            kit._markers.append(sandbox.marker)
            return await _call(sandbox, name, **input)

    return asyncio.run(main())


async def _call(sandbox: Sandbox, name: str, **input: Any) -> ToolOutcome:
    return await sandbox.run(
        CallRequest(call_id=f"call-{name}-{time.monotonic()}", name=name, ref=REF, input=input)
    )


def _result(outcome: ToolOutcome) -> Any:
    assert outcome.kind == "completed", outcome
    return json.loads(outcome.content()[0]["text"])


def test_named_servers_reached_by_curl(servers: dict[str, Any]) -> None:
    if shutil.which("curl") is None:
        pytest.skip("no curl binary")
    policy = _policy(servers)
    before = servers["http"].hits, servers["https"].hits
    plain = _run(policy, "curl", url=f"http://127.0.0.1:{servers['http'].port}/")
    assert _result(plain) == {"rc": 0, "out": BODY, "err": ""}
    secure = _run(policy, "curl", url=f"https://127.0.0.1:{servers['https'].port}/", cadata=servers["cadata"])
    assert _result(secure) == {"rc": 0, "out": BODY, "err": ""}
    assert (servers["http"].hits, servers["https"].hits) == (before[0] + 1, before[1] + 1)
    for outcome in (plain, secure):
        assert outcome.usage.network_bytes_up > 0 and outcome.usage.network_bytes_down > len(BODY)
        assert outcome.usage.network_denied == 0


def test_named_servers_reached_by_urllib_with_usage(servers: dict[str, Any]) -> None:
    urls = [f"http://127.0.0.1:{servers['http'].port}/", f"https://127.0.0.1:{servers['https'].port}/"]
    outcome = _run(_policy(servers), "fetch", urls=urls, cadata=servers["cadata"])
    assert _result(outcome) == [{"status": 200, "len": len(BODY), "body": BODY}] * 2
    big = _run(_policy(servers), "fetch", urls=[f"http://127.0.0.1:{servers['http'].port}/size/300000"])
    assert _result(big)[0]["len"] == 300_000
    assert 300_000 < big.usage.network_bytes_down < 301_000
    assert 0 < big.usage.network_bytes_up < 1000


def test_httpx_goes_through_the_proxy(servers: dict[str, Any]) -> None:
    url = f"https://127.0.0.1:{servers['https'].port}/"
    outcome = _run(_policy(servers), "httpx_get", url=url, cadata=servers["cadata"])
    assert _result(outcome) == {"status": 200, "body": BODY}
    assert outcome.usage.network_bytes_down > len(BODY)
    denied = _run(_policy(servers), "httpx_get", url=f"http://127.0.0.1:{servers['other'].port}/")
    assert _result(denied)["status"] == 403 and denied.usage.network_denied == 1


def test_tool_sees_the_proxy_variables(servers: dict[str, Any]) -> None:
    env = _result(_run(_policy(servers), "proxy_env"))
    assert env["http_proxy"] == env["HTTPS_PROXY"] == env["ALL_PROXY"]
    assert env["http_proxy"].startswith("http://127.0.0.1:")
    assert env["NO_PROXY"] == env["no_proxy"] == ""


def test_denied_targets_fail_with_reason_and_count(
    servers: dict[str, Any], caplog: pytest.LogCaptureFixture
) -> None:
    http_port, other = servers["http"].port, servers["other"]
    wildcard = f"*.localhost:{http_port}"
    policy = _policy(servers, allow_hosts=(*_policy(servers).allow_hosts, wildcard))
    urls = [
        "http://not-listed.invalid/",  # not on the list (refused before any DNS lookup)
        f"http://127.0.0.1:{other.port}/",  # a port no rule names
        f"http://svc.localhost:{http_port}/",  # only the wildcard matches, and it resolves to loopback
        "http://169.254.169.254/latest/meta-data/",  # the cloud metadata address
        f"https://not-listed.invalid:{http_port}/",  # CONNECT to a name off the list
    ]
    before = servers["http"].hits, other.hits
    with caplog.at_level(logging.WARNING, logger="stockade.sandbox.host.proxy"):
        outcome = _run(policy, "fetch", urls=urls)
    results = _result(outcome)
    for result in results[:4]:
        assert result["status"] == 403 and "stockade network denied" in result["body"], result
    assert "not on the allowlist" in results[0]["body"]
    assert "not on the allowlist" in results[1]["body"]
    assert "loopback" in results[2]["body"] and wildcard in results[2]["body"]
    assert "169.254.169.254:80 is not on the allowlist" in results[3]["body"]
    assert "403" in results[4]["error"] and "not on the allowlist" in results[4]["error"]
    assert (servers["http"].hits, other.hits) == before
    assert outcome.usage.network_denied == len(urls)
    denied = [r.getMessage() for r in caplog.records if r.getMessage().startswith("network_denied ")]
    assert len(denied) == len(urls)
    assert "host=169.254.169.254 port=80 tool=fetch" in " ".join(denied)


def test_curl_denial_is_a_403(servers: dict[str, Any]) -> None:
    if shutil.which("curl") is None:
        pytest.skip("no curl binary")
    outcome = _run(_policy(servers), "curl", url=f"http://127.0.0.1:{servers['other'].port}/")
    assert "not on the allowlist" in _result(outcome)["out"]
    assert outcome.usage.network_denied == 1


def test_raw_connect_ignoring_the_proxy_fails(servers: dict[str, Any]) -> None:
    before = servers["http"].hits
    for host in ("127.0.0.1", "169.254.169.254"):
        outcome = _run(_policy(servers), "raw_connect", host=host, port=servers["http"].port)
        assert outcome.kind == "completed" and outcome.content()[0]["text"].startswith("error:")
    assert servers["http"].hits == before


def test_connection_limit_per_call(servers: dict[str, Any]) -> None:
    url = f"http://127.0.0.1:{servers['http'].port}/"
    outcome = _run(_policy(servers, network_connections=2), "fetch", urls=[url] * 3)
    results = _result(outcome)
    assert [r["status"] for r in results] == [200, 200, 403]
    assert "network_connections limit (2)" in results[2]["body"]
    assert outcome.usage.network_denied == 1


def test_byte_limit_per_call(servers: dict[str, Any]) -> None:
    big = f"http://127.0.0.1:{servers['http'].port}/size/1000000"
    small = f"http://127.0.0.1:{servers['http'].port}/"
    outcome = _run(_policy(servers, network_bytes=100_000), "fetch", urls=[big, small])
    results = _result(outcome)
    assert "error" in results[0] or results[0]["len"] < 1_000_000
    assert results[1]["status"] == 403 and "network_bytes limit" in results[1]["body"]
    assert outcome.usage.network_bytes_up + outcome.usage.network_bytes_down <= 100_000


def test_allowlist_fails_closed_without_netns(
    servers: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("STOCKADE_DISABLE_LAYERS", "netns")
    outcome = _run(_policy(servers), "proxy_env")
    assert outcome.kind == "failed" and "network=allowlist needs the netns layer" in outcome.error_text()


def test_a_slow_reader_neither_starves_another_call_nor_fills_memory(servers: dict[str, Any]) -> None:
    base = f"http://127.0.0.1:{servers['http'].port}"
    ended: dict[str, float] = {}

    async def timed(sandbox: Sandbox, label: str, name: str, **input: Any) -> ToolOutcome:
        outcome = await _call(sandbox, name, **input)
        ended[label] = time.monotonic()
        return outcome

    async def main() -> tuple[ToolOutcome, ToolOutcome, float]:
        async with Sandbox(default=_policy(servers, network_bytes=None, pool_size=2)) as sandbox:
            kit._markers.append(sandbox.marker)
            await sandbox.warm()
            slow = asyncio.ensure_future(
                timed(sandbox, "slow", "slow_read", url=f"{base}/size/{FLOOD_BYTES}", seconds=3)
            )
            await asyncio.sleep(0.5)
            started = time.monotonic()
            quick = await timed(sandbox, "quick", "fetch", urls=[f"{base}/"] * 3)
            return await slow, quick, time.monotonic() - started

    slow, quick, quick_s = asyncio.run(main())
    assert [r["status"] for r in _result(quick)] == [200] * 3
    assert ended["quick"] < ended["slow"] and quick.usage.wall_s < 2.0, (quick_s, quick.usage)
    # Back-pressure: the proxy moved only about what the tool read (plus socket buffers), not the flood.
    read = int(slow.content()[0]["text"])
    assert 0 < read < FLOOD_BYTES // 4
    assert slow.usage.network_bytes_down < read + 16 * CHUNK


def test_junk_handed_to_the_proxy_socket_is_dropped(servers: dict[str, Any]) -> None:
    url = f"http://127.0.0.1:{servers['http'].port}/"

    async def main() -> tuple[ToolOutcome, ToolOutcome]:
        async with Sandbox(default=_policy(servers)) as sandbox:
            kit._markers.append(sandbox.marker)
            junk = await _call(sandbox, "bad_handovers")
            return junk, await _call(sandbox, "fetch", urls=[url])

    junk, after = asyncio.run(main())
    assert junk.kind == "completed" and "sent 5 handovers" in junk.content()[0]["text"]
    assert _result(after)[0]["status"] == 200


def test_a_tunnel_kept_past_its_call_is_dropped_when_the_next_call_starts(servers: dict[str, Any]) -> None:
    async def main() -> tuple[ToolOutcome, ToolOutcome]:
        async with Sandbox(default=_policy(servers)) as sandbox:
            kit._markers.append(sandbox.marker)
            # Both calls are of one tool, so the second runs in the worker that keeps the tunnel.
            held = await _call(sandbox, "held_tunnel", step="open", port=servers["http"].port)
            return held, await _call(sandbox, "held_tunnel", step="state")

    held, state = asyncio.run(main())
    assert held.content()[0]["text"] == "HTTP/1.1 200 Connection established"
    assert state.content()[0]["text"].startswith("closed")


def test_a_bad_pattern_in_a_programmatic_policy_is_a_clear_outcome(servers: dict[str, Any]) -> None:
    outcome = _run(_policy(servers, allow_hosts=("exa mple.org",)), "proxy_env")
    assert outcome.is_error and "egress proxy did not start" in outcome.error_text()
    assert "'exa mple.org' is not a valid host name" in outcome.error_text()
