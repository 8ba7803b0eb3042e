"""The HTTP face of the emulator: routing, auth, API errors, injected faults and the SSE stream.

One `ThreadingHTTPServer` thread per request. Requests are answered and recorded here; session state
lives in `SessionState`.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

from stockade.emulator.events import IdMaker, error_body
from stockade.emulator.faults import FaultSpec
from stockade.emulator.messages import MessagesState, messages_route
from stockade.emulator.record import RecordedRequest, Recorder
from stockade.emulator.resources import ResourceBook, resource_endpoint
from stockade.emulator.session import SessionState
from stockade.emulator.sse import StreamWriter
from stockade.emulator.validate import Rejected
from stockade.emulator.work import WorkQueues, work_endpoint

__all__ = ["BETA_TOKEN", "EmulatorHTTPServer", "ServerContext"]

log = logging.getLogger(__name__)

BETA_TOKEN = "managed-agents-2026-04-01"
MAX_PAGE_LIMIT = 1000
IDLE_CLIENT_TIMEOUT_S = 5.0
"""A connection that sends no request within this long is dropped (bounds the join at shutdown)."""
_NON_JSON_BODY = b"<html><body><h1>502 Bad Gateway</h1></body></html>"
_DEFAULT_MESSAGES = {413: "Request exceeds the maximum allowed number of bytes.", 429: "Rate limited."}


@dataclass
class ServerContext:
    """What request handlers share: sessions, the record, auth keys, ids and the closing flag."""

    sessions: dict[str, SessionState]
    api_keys: frozenset[str] | None
    recorder: Recorder = field(default_factory=Recorder)
    ids: IdMaker = field(default_factory=IdMaker)
    closing: threading.Event = field(default_factory=threading.Event)
    messages: MessagesState | None = None
    """The scripted `POST /v1/messages` endpoint, when a Messages script is loaded."""
    work: WorkQueues = field(default_factory=WorkQueues)
    """Self-hosted environments' work queues (`/v1/environments/{env}/work/...`)."""
    resources: ResourceBook = field(default_factory=ResourceBook)
    """Sessions' skills and memory stores (`/v1/skills/...`, `/v1/memory_stores/...`)."""


class EmulatorHTTPServer(ThreadingHTTPServer):
    """A threading HTTP server carrying the shared `ServerContext`."""

    # Request threads are joined by server_close(); streams notice shutdown within POLL_INTERVAL_S.
    daemon_threads = False
    block_on_close = True

    def __init__(self, address: tuple[str, int], context: ServerContext) -> None:
        super().__init__(address, _Handler)
        self.context = context


class _Handler(BaseHTTPRequestHandler):
    server: EmulatorHTTPServer
    protocol_version = "HTTP/1.0"
    timeout = IDLE_CLIENT_TIMEOUT_S

    # ----- entry points --------------------------------------------------------------------------------

    def do_GET(self) -> None:
        self._dispatch("GET")

    def do_POST(self) -> None:
        self._dispatch("POST")

    def do_DELETE(self) -> None:
        self._dispatch("DELETE")

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("http_request client=%s line=%s", self.address_string(), format % args)

    # ----- request plumbing ----------------------------------------------------------------------------

    def _dispatch(self, method: str) -> None:
        self._arrived = time.time()
        self._arrived_mono = time.monotonic()
        self._fault: str | None = None
        url = urlsplit(self.path)
        self._query = parse_qs(url.query, keep_blank_values=True)
        self._body = self._read_body()
        parts = [unquote(p) for p in url.path.strip("/").split("/")]
        self._endpoint, self._session_id = _route(method, parts)
        try:
            self._handle()
        except (BrokenPipeError, ConnectionResetError):
            log.debug("client_gone path=%s", url.path)

    def _read_body(self) -> Any:
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        if not raw:
            return None
        try:
            return json.loads(raw)
        except ValueError:
            return raw.decode("utf-8", "replace")

    def _record(self, status: int) -> None:
        headers: dict[str, str] = {}
        for name, value in self.headers.items():
            key = name.lower()
            headers[key] = f"{headers[key]}, {value}" if key in headers else value
        self.server.context.recorder.add(
            RecordedRequest(
                method=self.command,
                path=urlsplit(self.path).path,
                query=self._query,
                headers=headers,
                body=self._body,
                time=self._arrived,
                monotonic=self._arrived_mono,
                endpoint=self._endpoint,
                session_id=self._session_id,
                status=status,
                fault=self._fault,
            )
        )

    def _send_json(self, status: int, body: Any, headers: dict[str, str] | None = None) -> None:
        self._record(status)
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.send_header("request-id", self.server.context.ids.new("req"))
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(data)

    def _send_error(
        self, status: int, message: str, error_type: str | None = None, headers: dict[str, str] | None = None
    ) -> None:
        request_id = self.server.context.ids.new("req")
        self._send_json(status, error_body(status, message, request_id, error_type), headers)

    # ----- checks --------------------------------------------------------------------------------------

    def _auth_error(self, *, needs_beta: bool = True) -> tuple[int, str] | None:
        bearer = self.headers.get("Authorization", "")
        key = self.headers.get("x-api-key") or (
            bearer[7:].strip() if bearer.lower().startswith("bearer ") else ""
        )
        keys = self.server.context.api_keys
        if not key:
            return 401, "x-api-key header is required"
        if keys is not None and key not in keys:
            return 401, "invalid x-api-key"
        betas = [t.strip() for t in self.headers.get("anthropic-beta", "").split(",")]
        if needs_beta and BETA_TOKEN not in betas:
            return 400, f"this endpoint requires the anthropic-beta header to contain {BETA_TOKEN}"
        return None

    def _handle(self) -> None:
        # The Messages API is not a managed-agents endpoint: it needs a key, not that beta.
        # Skills and memory stores carry their own betas (skills / agent-memory), not managed-agents.
        own_beta = self._endpoint == "messages" or self._endpoint.startswith(("skill_", "memory_"))
        problem = self._auth_error(needs_beta=not own_beta)
        if problem is None and self._endpoint == "messages":
            self._messages()
            return
        if problem is not None:
            self._send_error(*problem)
            return
        if self._endpoint.startswith("work_"):
            parts = [unquote(p) for p in urlsplit(self.path).path.strip("/").split("/")]
            self._send_json(*self.server.context.work.handle(self._endpoint, parts, self._query, self._body))
            return
        if self._endpoint.startswith(("skill_", "memory_")):
            self._resource()
            return
        session = self.server.context.sessions.get(self._session_id or "")
        if self._endpoint == "other" or session is None:
            what = f"session {self._session_id}" if self._session_id else f"{self.command} {self.path}"
            self._send_error(404, f"{what} not found")
            return
        page = self._list_page_number(session) if self._endpoint == "list" else None
        faults = session.faults.take(self._endpoint, page)
        if self._apply_faults(faults):
            return
        stream_fault = next((f for f in faults if f.action == "stream"), None)
        handlers = {"retrieve": self._retrieve, "list": self._list, "send": self._send}
        if self._endpoint == "stream":
            self._stream(session, stream_fault)
        else:
            handlers[self._endpoint](session)

    def _resource(self) -> None:
        """A skills or memory-store request; the owning session's faults apply to it."""
        context = self.server.context
        parts = [unquote(p) for p in urlsplit(self.path).path.strip("/").split("/")]
        owner = context.sessions.get(context.resources.owner.get(parts[2], ""))
        if owner is not None and self._apply_faults(owner.faults.take(self._endpoint)):
            return
        status, body, raw = context.resources.handle(self._endpoint, parts, self._query, self._body)
        if raw is None:
            self._send_json(status, body)
            return
        self._record(status)
        self.send_response(status)
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Content-Length", str(len(raw)))
        self.end_headers()
        self.wfile.write(raw)

    def _messages(self) -> None:
        """`POST /v1/messages`: the scripted Messages endpoint (see `stockade.emulator.messages`)."""
        state = self.server.context.messages
        if state is None:
            self._send_error(404, "no Messages script is loaded")
            return
        status, content_type, payload = messages_route(state, self._body)
        self._record(status)
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def _list_page_number(self, session: SessionState) -> int | None:
        cursor = self._query.get("page", [""])[-1]
        if cursor and not session.valid_cursor(cursor):
            return None
        return session.page_number(
            cursor or None, _int_or(self._query.get("limit", [""])[-1], MAX_PAGE_LIMIT)
        )

    # ----- faults --------------------------------------------------------------------------------------

    def _apply_faults(self, faults: list[FaultSpec]) -> bool:
        """Apply request faults that answer instead of the endpoint; True if one answered."""
        for fault in faults:
            if fault.action == "delay_s":
                self.server.context.closing.wait(float(fault.value))
        for fault in faults:
            if fault.action in ("status", "non_json", "no_match"):
                self._fault = fault.action
                self._answer_fault(fault)
                return True
        return False

    def _answer_fault(self, fault: FaultSpec) -> None:
        if fault.action == "non_json":
            self._record(200)
            self.send_response(200)
            self.send_header("Content-Type", "text/html")
            self.send_header("Content-Length", str(len(_NON_JSON_BODY)))
            self.end_headers()
            self.wfile.write(_NON_JSON_BODY)
            return
        if fault.action == "no_match":
            events = self._body.get("events") if isinstance(self._body, dict) else None
            first = events[0] if isinstance(events, list) and events and isinstance(events[0], dict) else {}
            key = "custom_tool_use_id" if "custom_tool_use_id" in first else "tool_use_id"
            kind = "agent.custom_tool_use" if key == "custom_tool_use_id" else "agent.tool_use"
            self._send_error(
                400, f'`{key}` "{first.get(key)}" does not match any `{kind}` event in this session'
            )
            return
        status = int(fault.value)
        message = fault.options.get("message") or _DEFAULT_MESSAGES.get(
            status, f"emulated fault: status {status}"
        )
        self._send_error(status, message, fault.options.get("error_type"), _retry_headers(fault))

    # ----- endpoints -----------------------------------------------------------------------------------

    def _retrieve(self, session: SessionState) -> None:
        body = session.session_json()
        resources = self.server.context.resources
        skills = resources.skills_of(session.session_id)
        body["agent"]["skills"] = [s.agent_json() for s in skills if not s.subagent]
        body["resources"] = [s.resource_json() for s in resources.stores_of(session.session_id)]
        if sub := [s.agent_json() for s in skills if s.subagent]:
            body["agent"]["multiagent"] = _coordinator(sub)
        self._send_json(200, body)

    def _list(self, session: SessionState) -> None:
        limit = _int_or(self._query.get("limit", [""])[-1], MAX_PAGE_LIMIT)
        order = self._query.get("order", ["asc"])[-1]
        cursor = self._query.get("page", [""])[-1] or None
        if not 1 <= limit <= MAX_PAGE_LIMIT:
            self._send_error(400, f"limit: Input should be between 1 and {MAX_PAGE_LIMIT}")
        elif order not in ("asc", "desc"):
            self._send_error(400, "order: Input should be 'asc' or 'desc'")
        elif cursor is not None and not session.valid_cursor(cursor):
            self._send_error(400, f"page: invalid page cursor {cursor!r}")
        else:
            types = self._query.get("types[]", [])
            data, next_page = session.history_page(limit, cursor, order, types)
            self._send_json(200, {"data": data, "next_page": next_page})

    def _send(self, session: SessionState) -> None:
        try:
            stored = session.post(self._body)
        except Rejected as exc:
            self._send_error(exc.status, exc.message)
            return
        self._send_json(200, {"data": stored})

    def _stream(self, session: SessionState, fault: FaultSpec | None) -> None:
        sub = session.subscribe()
        try:
            self._record(200)
            if fault is not None:
                self._fault = "stream"
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Cache-Control", "no-cache")
            self.send_header("request-id", self.server.context.ids.new("req"))
            self.end_headers()
            writer = StreamWriter(self.connection, self.wfile, self.server.context.closing)
            writer.run(sub, session.scenario.keepalive_s, fault)
        finally:
            session.unsubscribe(sub)


def _route(method: str, parts: list[str]) -> tuple[str, str | None]:
    """(endpoint, session id) for a request path split on `/`."""
    if (method, *parts) == ("POST", "v1", "messages"):
        return "messages", None
    if (work := work_endpoint(method, parts)) is not None:
        return work, None
    if (resource := resource_endpoint(method, parts)) is not None:
        return resource, None
    if len(parts) < 3 or parts[:2] != ["v1", "sessions"]:
        return "other", None
    tail = (method, *parts[3:])
    endpoints = {
        ("GET",): "retrieve",
        ("GET", "events"): "list",
        ("POST", "events"): "send",
        ("GET", "events", "stream"): "stream",
    }
    return endpoints.get(tail, "other"), parts[2]


def _coordinator(skills: list[dict[str, Any]]) -> dict[str, Any]:
    """A coordinator `multiagent` block with one subagent that carries `skills`."""
    member = {
        "type": "agent",
        "id": "agent_emulator_sub",
        "version": 1,
        "name": "emulated subagent",
        "description": None,
        "system": None,
        "execution_identity": {"type": "service_account"},
        "mcp_servers": [],
        "model": {"id": "claude-opus-4-7"},
        "skills": skills,
        "tools": [],
    }
    return {"type": "coordinator", "agents": [member]}


def _int_or(text: str, default: int) -> int:
    try:
        return int(text) if text else default
    except ValueError:
        return -1


def _retry_headers(fault: FaultSpec) -> dict[str, str]:
    headers: dict[str, str] = {}
    if "retry_after_s" in fault.options:
        headers["retry-after"] = str(fault.options["retry_after_s"])
    if "retry_after_ms" in fault.options:
        headers["retry-after-ms"] = str(fault.options["retry_after_ms"])
    if "should_retry" in fault.options:
        headers["x-should-retry"] = "true" if fault.options["should_retry"] else "false"
    return headers
