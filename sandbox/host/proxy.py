"""The egress proxy of one `network = "allowlist"` worker (supervisor side, asyncio streams).

Each such worker gets its own proxy listening on a unix socket in its workdir; the worker reaches
it only through that socket: its forwarder (`sandbox/child/forward.py`) accepts a tool's loopback TCP
connection inside the worker's network namespace and hands the socket itself over
(`proxy_handover.py`), so the proxy reads and writes the tool's connection directly. For every
connection the proxy parses the request (`proxy_http.py`), matches the target against the allowlist
*before* resolving it (so names off the list never reach DNS), resolves it itself, checks every
address (`sandbox/netrules.py`) and connects only to checked addresses. A denial is a 403 with
the reason and a `network_denied` log line.

Accounting and limits are per call (`begin_call`): connections, bytes up and down, denials;
`network_connections` and `network_bytes` cap them. Fairness: each connection is its own pair of
tasks moving at most `CHUNK_BYTES` per step and awaiting `drain()` (bounded buffers), so a fast or
stuck connection never holds up another call's.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
import os
import secrets
import socket
from dataclasses import dataclass, field

import psutil
from stockade.sandbox.host.proxy_handover import HandoverServer
from stockade.sandbox.host.proxy_http import (
    BadRequest,
    ProxyRequest,
    denial,
    error_response,
    parse_head,
    printable,
)
from stockade.sandbox.netrules import (
    IPAddress,
    Rule,
    RuleError,
    check_name,
    decide,
    is_loopback_name,
    match,
    parse_rules,
    target_address,
)
from stockade.sandbox.policy import ResourcePolicy
from stockade.sandbox.tasks import cancel_and_wait

__all__ = ["PROXY_SOCKET_ENV", "CallNet", "EgressProxy", "host_addresses", "socket_path_for"]

log = logging.getLogger(__name__)

PROXY_SOCKET_ENV = "STOCKADE_PROXY_SOCKET"
"""Tells the worker where its proxy listens (`sandbox/child/forward.py` reads the same name)."""
HEAD_LIMIT_BYTES = 64 << 10
CHUNK_BYTES = 256 << 10
HEAD_TIMEOUT_S = 10.0
CONNECT_TIMEOUT_S = 10.0
RESOLVE_TIMEOUT_S = 10.0
MAX_UNIX_PATH = 107

_Pair = tuple[asyncio.StreamReader, asyncio.StreamWriter]


@dataclass
class CallNet:
    """Network use of one call (the proxy's figures)."""

    tool: str = ""
    connections: int = 0
    bytes_up: int = 0
    bytes_down: int = 0
    denied: int = 0
    limit_hit: str | None = None
    tasks: set[asyncio.Task[None]] = field(default_factory=set)
    """The call's open connections (one task each)."""

    def drop_connections(self) -> None:
        for task in list(self.tasks):
            task.cancel()


def host_addresses() -> frozenset[IPAddress]:
    """Every address on the host's interfaces (the proxy denies them unless a rule names them)."""
    found: set[IPAddress] = set()
    for addrs in psutil.net_if_addrs().values():
        for addr in addrs:
            if addr.family in (socket.AF_INET, socket.AF_INET6):
                with contextlib.suppress(ValueError):
                    found.add(ipaddress.ip_address(addr.address.split("%", 1)[0]))
    return frozenset(found)


def socket_path_for(workdir: str, worker_id: str) -> str:
    """Where the proxy of worker `worker_id` listens: in its workdir, the one folder it always sees."""
    # Unpredictable: with a shared workdir, another worker's tool must not prepare the path.
    return os.path.join(workdir, f".stockade-proxy-{worker_id}-{secrets.token_hex(4)}.sock")


class EgressProxy:
    """One worker's allowlist proxy."""

    def __init__(self, policy: ResourcePolicy, path: str) -> None:
        self.policy = policy
        self.path = path
        self.rules: tuple[Rule, ...] = parse_rules(policy.allow_hosts)
        self.call = CallNet()
        self._server = HandoverServer(path, self._serve, HEAD_LIMIT_BYTES)
        self._own_addresses: frozenset[IPAddress] = frozenset()

    async def start(self) -> None:
        """Listen on the unix socket for connections the worker's forwarder hands over."""
        if len(os.fsencode(self.path)) > MAX_UNIX_PATH:
            raise OSError(f"proxy socket path too long for a unix socket: {self.path}")
        self._own_addresses = await asyncio.to_thread(host_addresses)
        self._server.start()

    def begin_call(self, tool: str, *, drop_previous: bool = True) -> None:
        """Start accounting a new call of `tool`. The previous call's connections are dropped, as its
        processes were swept (`drop_previous`); else they keep counting for it."""
        if drop_previous:
            self.call.drop_connections()
        self.call = CallNet(tool=tool)

    def close(self) -> None:
        """Stop listening, drop every connection, remove the socket. Idempotent."""
        self._server.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        call = self.call
        task = asyncio.current_task()
        assert task is not None
        call.tasks.add(task)
        try:
            await self._handle(call, reader, writer)
        except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, TimeoutError):
            pass
        finally:
            call.tasks.discard(task)
            writer.close()

    async def _handle(
        self, call: CallNet, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), HEAD_TIMEOUT_S)
        try:
            request = parse_head(head)
        except BadRequest as exc:
            writer.write(error_response(400, "Bad Request", f"stockade proxy: {exc}"))
            await writer.drain()
            return
        addresses = await self._admit(call, request)
        if isinstance(addresses, str):
            writer.write(denial(addresses))
            await writer.drain()
            return
        upstream = await self._connect(addresses, request.port)
        if upstream is None:
            message = f"could not connect to {request.host}:{request.port}"
            writer.write(error_response(502, "Bad Gateway", f"stockade proxy: {message}"))
            await writer.drain()
            return
        await self._relay(call, request, (reader, writer), upstream)

    def _deny(self, call: CallNet, request: ProxyRequest, reason: str) -> str:
        call.denied += 1
        host, why = printable(request.host), printable(reason)
        log.warning("network_denied host=%s port=%d tool=%s reason=%r", host, request.port, call.tool, why)
        return reason

    async def _admit(self, call: CallNet, request: ProxyRequest) -> tuple[str, ...] | str:
        """The checked addresses to connect to, or the reason of the denial."""
        limit = self._limit_reason(call)
        if limit is not None:
            return self._deny(call, request, limit)
        try:
            if target_address(request.host) is None:
                check_name(request.host, request.host)
        except RuleError:
            return self._deny(call, request, f"{request.host!r} is not a valid host name or address")
        if match(self.rules, request.host, request.port) is None:  # before DNS: nothing leaks there
            return self._deny(call, request, f"{request.host}:{request.port} is not on the allowlist")
        decision = decide(
            self.rules, request.host, request.port, await self._resolve(request), self._own_addresses
        )
        if not decision.allowed:
            return self._deny(call, request, decision.reason)
        call.connections += 1
        return decision.addresses

    def _limit_reason(self, call: CallNet) -> str | None:
        policy = self.policy
        if call.limit_hit is not None:
            return f"this call reached its {call.limit_hit} limit"
        if policy.network_connections is not None and call.connections >= policy.network_connections:
            return f"this call reached its network_connections limit ({policy.network_connections})"
        return None

    async def _resolve(self, request: ProxyRequest) -> list[str]:
        address = target_address(request.host)
        if address is not None:
            return [str(address)]
        host = request.host.lower().removesuffix(".")
        if is_loopback_name(host):
            return ["127.0.0.1"]
        loop = asyncio.get_running_loop()
        try:
            infos = await asyncio.wait_for(
                loop.getaddrinfo(host, request.port, type=socket.SOCK_STREAM), RESOLVE_TIMEOUT_S
            )
        except (OSError, TimeoutError):
            return []
        return list(dict.fromkeys(str(info[4][0]) for info in infos))

    async def _connect(self, addresses: tuple[str, ...], port: int) -> _Pair | None:
        for address in addresses:
            with contextlib.suppress(OSError, TimeoutError):
                return await asyncio.wait_for(
                    asyncio.open_connection(address, port, limit=CHUNK_BYTES), CONNECT_TIMEOUT_S
                )
        return None

    async def _relay(self, call: CallNet, request: ProxyRequest, client: _Pair, upstream: _Pair) -> None:
        (reader, writer), (up_reader, up_writer) = client, upstream
        try:
            if request.tunnel:
                writer.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
                await writer.drain()
            elif self._count(call, len(request.upstream_head), up=True):
                up_writer.write(request.upstream_head)
                await up_writer.drain()
            else:
                return
            pumps = [
                asyncio.ensure_future(self._pump(call, reader, up_writer, up=True)),
                asyncio.ensure_future(self._pump(call, up_reader, writer, up=False)),
            ]
            try:
                # Upstream's end ends the exchange; the client's end only half-closes it.
                await pumps[1]
            finally:
                await cancel_and_wait(*pumps)
        finally:
            up_writer.close()

    async def _pump(
        self, call: CallNet, src: asyncio.StreamReader, dst: asyncio.StreamWriter, *, up: bool
    ) -> None:
        with contextlib.suppress(OSError):
            while chunk := await src.read(CHUNK_BYTES):
                if not self._count(call, len(chunk), up=up):
                    return
                dst.write(chunk)
                await dst.drain()
            if dst.can_write_eof():
                dst.write_eof()

    def _count(self, call: CallNet, size: int, *, up: bool) -> bool:
        """Account `size` bytes about to be forwarded; False (not forwarded, and every connection of
        the call ends) if they would take the call over `network_bytes`."""
        cap = self.policy.network_bytes
        if cap is not None and call.bytes_up + call.bytes_down + size > cap:
            if call.limit_hit is None:
                call.limit_hit = "network_bytes"
                log.warning("network_limit limit=network_bytes tool=%s bytes=%d", call.tool, cap)
                call.drop_connections()
            return False
        if up:
            call.bytes_up += size
        else:
            call.bytes_down += size
        return True
