"""One emulated session: its event log, tool calls, threads, open streams and server-side reactions.

All state changes go through `SessionState.append` under one lock, so every stream sees events in log
order. Server reactions (api.md §8) follow posted results and confirmations: a denied confirmation gets a
synthetic `agent.tool_result`, and when a call that blocked the session is resolved the session either
re-emits `requires_action` with the remaining blockers or goes back to running.
"""

from __future__ import annotations

import itertools
import logging
import queue
import threading
import time
from dataclasses import dataclass
from typing import Any

from stockade.emulator.events import PRIMARY_THREAD, IdMaker, now_rfc3339, session_object, status_of
from stockade.emulator.faults import FaultBook
from stockade.emulator.scenario import Scenario
from stockade.emulator.validate import CallInfo, check_body

__all__ = ["CALL_TYPES", "Call", "SessionState", "Subscriber"]

log = logging.getLogger(__name__)

Event = dict[str, Any]
CALL_TYPES = ("agent.tool_use", "agent.custom_tool_use", "agent.mcp_tool_use")
_ANSWER_KEYS = {
    "user.tool_result": "tool_use_id",
    "agent.tool_result": "tool_use_id",
    "user.custom_tool_result": "custom_tool_use_id",
    "agent.mcp_tool_result": "mcp_tool_use_id",
}
_IDLE_TYPES = ("session.status_idle", "session.thread_status_idle")
_TERMINAL_TYPES = ("session.status_terminated", "session.deleted")
_CURSOR_PREFIX = "cursor_"


@dataclass
class Call:
    """A tool call the agent made, and whether the session still waits on it."""

    id: str
    kind: str
    thread: str
    permission: str | None
    state: str = "pending"  # "pending" | "awaiting_confirmation" | "answered" | "not_waited"

    @property
    def blocking(self) -> bool:
        """Whether the session is idle `requires_action` on this call (confirmation or client result)."""
        if self.state == "awaiting_confirmation":
            return True
        needs_listing = self.kind == "agent.custom_tool_use" or (
            self.kind == "agent.tool_use" and self.permission is None
        )
        return self.state == "pending" and needs_listing


class Subscriber:
    """One open stream connection: a queue of ("event", dict) | ("action", name) | ("close", None)."""

    def __init__(self, seq: int) -> None:
        self.seq = seq
        self.queue: queue.SimpleQueue[tuple[str, Any]] = queue.SimpleQueue()


def thread_of(event: Event) -> str:
    """The thread key of an event (`""` for the primary thread)."""
    return str(event.get("session_thread_id") or PRIMARY_THREAD)


class SessionState:
    """The server-side state of one session."""

    def __init__(self, scenario: Scenario, ids: IdMaker) -> None:
        self.scenario = scenario
        self.ids = ids
        self.session_id = scenario.session_id or ids.new("sesn")
        self.created_at = now_rfc3339()
        self.faults = FaultBook(scenario.faults, scenario.seed)
        self.started = threading.Event()
        self.posted: list[Event] = []
        self.changed = threading.Condition(threading.RLock())
        self._log: list[Event] = []
        self._calls: dict[str, Call] = {}
        self._agent_names: dict[str, str] = {}
        self._terminated_threads: set[str] = set()
        self._subscribers: set[Subscriber] = set()
        self._seq = itertools.count()
        self._archived_at: str | None = now_rfc3339() if scenario.archived else None
        if scenario.start == "now":
            self.started.set()

    # ----- reading -------------------------------------------------------------------------------------

    def status(self) -> str:
        """The session status derived from the log (api.md §6)."""
        with self.changed:
            return status_of(self._log, self._archived_at is not None)

    def session_json(self) -> dict[str, Any]:
        """The session object for `GET /v1/sessions/{id}`."""
        with self.changed:
            return session_object(
                self.session_id,
                self.status(),
                self.created_at,
                title=self.scenario.title,
                archived_at=self._archived_at,
            )

    def events(self) -> list[Event]:
        """A copy of the whole log."""
        with self.changed:
            return list(self._log)

    def agent_name(self, thread: str) -> str:
        """The agent name a thread was created with (a default for unknown threads)."""
        return self._agent_names.get(thread, "subagent")

    def blockers(self, thread: str) -> list[str]:
        """Ids of the calls on `thread` that keep it idle `requires_action`, in call order."""
        with self.changed:
            return [c.id for c in self._calls.values() if c.thread == thread and c.blocking]

    def unanswered(self) -> list[str]:
        """Ids of every call that has no result yet."""
        with self.changed:
            return [
                c.id for c in self._calls.values() if c.state != "answered" and c.kind != "agent.mcp_tool_use"
            ]

    def is_answered(self, call_id: str) -> bool:
        """Whether a result for this call is in the log."""
        with self.changed:
            call = self._calls.get(call_id)
            return call is not None and call.state == "answered"

    def history_page(
        self, limit: int, cursor: str | None, order: str, types: list[str]
    ) -> tuple[list[Event], str | None]:
        """One page of history: events, and the cursor of the next page (None on the last page)."""
        with self.changed:
            hidden = self.faults.hidden_from_history()
            events = [e for e in self._log if e["id"] not in hidden and (not types or e["type"] in types)]
            if order == "desc":
                events.reverse()
            start = int(cursor.removeprefix(_CURSOR_PREFIX)) if cursor else 0
            page = events[start : start + limit]
            has_more = start + limit < len(events)
            if not has_more:
                self._on_history_read()
            return page, f"{_CURSOR_PREFIX}{start + limit}" if has_more else None

    @staticmethod
    def page_number(cursor: str | None, limit: int) -> int:
        """The 1-based page number a cursor points at (for per-page faults)."""
        start = int(cursor.removeprefix(_CURSOR_PREFIX)) if cursor else 0
        return start // max(limit, 1) + 1

    @staticmethod
    def valid_cursor(cursor: str) -> bool:
        """Whether `cursor` is one this emulator issued."""
        return cursor.startswith(_CURSOR_PREFIX) and cursor.removeprefix(_CURSOR_PREFIX).isdigit()

    # ----- streams -------------------------------------------------------------------------------------

    def subscribe(self) -> Subscriber:
        """Open a stream: it receives every event appended from now on (no replay)."""
        with self.changed:
            sub = Subscriber(next(self._seq))
            self._subscribers.add(sub)
            if self.scenario.start == "stream":
                self.started.set()
            return sub

    def unsubscribe(self, sub: Subscriber) -> None:
        """Forget a closed stream."""
        with self.changed:
            self._subscribers.discard(sub)

    def open_streams(self) -> int:
        """How many stream connections are open."""
        with self.changed:
            return len(self._subscribers)

    def signal_streams(self, kind: str, value: Any = None) -> None:
        """Send an action (a stream fault) or a close to every open stream."""
        with self.changed:
            for sub in self._subscribers:
                sub.queue.put((kind, value))

    def _on_history_read(self) -> None:
        # The script starts once a stream opened before this (last) history page: from then on, every
        # event reaches that client either in the history it read or on its stream (api.md §4.10).
        if self.scenario.start == "history" and self._subscribers:
            self.started.set()

    # ----- writing -------------------------------------------------------------------------------------

    def append(self, event: Event) -> Event:
        """Emit an event: fill in `id`/`processed_at`, track it, log it and push it to open streams."""
        with self.changed:
            event = {"id": event.get("id") or self.ids.new("sevt"), **event}
            event.setdefault("processed_at", now_rfc3339())
            self._track(event)
            self._log.append(event)
            duplicate = self.faults.duplicates(event["id"])
            if duplicate is not None and duplicate.options.get("in_history"):
                self._log.append(event)
            for sub in self._subscribers:
                sub.queue.put(("event", event))
                if duplicate is not None:
                    sub.queue.put(("event", event))
                if event["type"] in _TERMINAL_TYPES:
                    sub.queue.put(("close", None))
            self.changed.notify_all()
            log.debug(
                "event_emitted session_id=%s type=%s id=%s", self.session_id, event["type"], event["id"]
            )
            return event

    def archive(self) -> None:
        """Archive the session: no event; its status becomes terminated."""
        with self.changed:
            self._archived_at = now_rfc3339()
            self.changed.notify_all()

    def post(self, body: Any) -> list[Event]:
        """Validate and apply a client's send body; raise `Rejected` if the API refuses it."""
        with self.changed:
            events = check_body(body, self._call_infos(), strict_results=self.scenario.strict_results)
            stored = [self.from_client(event) for event in events]
            self.posted.extend(stored)
            return stored

    def from_client(self, event: Event) -> Event:
        """Append a user event (posted, or scripted as from another client) and run the server's reactions."""
        with self.changed:
            call = self._calls.get(str(event.get(_ANSWER_KEYS.get(event["type"], "tool_use_id"), "")))
            was_blocking = call is not None and call.blocking
            stored = self.append(event)
            if call is not None and was_blocking and self.scenario.reactions:
                self._react(stored, call)
            return stored

    def wait_until(self, predicate: Any, timeout_s: float, stop: threading.Event) -> bool:
        """Wait until `predicate()` holds; False on timeout or when `stop` is set."""
        deadline = time.monotonic() + timeout_s
        with self.changed:
            while not predicate():
                remaining = deadline - time.monotonic()
                if remaining <= 0 or stop.is_set():
                    return False
                self.changed.wait(min(remaining, 0.1))
            return True

    # ----- internals -----------------------------------------------------------------------------------

    def _call_infos(self) -> dict[str, CallInfo]:
        return {
            c.id: CallInfo(c.kind, c.thread, c.state == "answered", c.thread in self._terminated_threads)
            for c in self._calls.values()
        }

    def _track(self, event: Event) -> None:
        kind = event["type"]
        if kind in CALL_TYPES:
            permission = event.get("evaluated_permission")
            state = "awaiting_confirmation" if permission == "ask" else "pending"
            self._calls[event["id"]] = Call(event["id"], kind, thread_of(event), permission, state)
        elif kind in _ANSWER_KEYS:
            call = self._calls.get(str(event.get(_ANSWER_KEYS[kind])))
            if call is not None:
                call.state = "answered"
        elif kind == "user.tool_confirmation":
            call = self._calls.get(str(event.get("tool_use_id")))
            if call is not None and call.state == "awaiting_confirmation" and event.get("result") == "allow":
                call.state = "pending"
        elif kind in _IDLE_TYPES:
            self._stop_waiting(event)
        elif kind == "session.thread_created":
            self._agent_names[thread_of(event)] = str(event.get("agent_name", "subagent"))
        elif kind == "session.thread_status_terminated":
            self._terminated_threads.add(thread_of(event))

    def _stop_waiting(self, idle: Event) -> None:
        # The server waits only on the calls the latest idle lists; an idle that ends the turn waits on
        # none (except after `retries_exhausted`), so a later answer to such a call starts no reaction.
        reason = idle.get("stop_reason") or {}
        if reason.get("type") == "retries_exhausted":
            return
        listed = set(reason.get("event_ids") or ()) if reason.get("type") == "requires_action" else set()
        thread = thread_of(idle)
        for call in self._calls.values():
            if call.thread != thread or call.state not in ("pending", "not_waited"):
                continue
            call.state = "pending" if call.id in listed else "not_waited"

    def _react(self, event: Event, call: Call) -> None:
        if event["type"] == "user.tool_confirmation" and event.get("result") != "allow":
            message = event.get("deny_message") or "The user denied permission to use this tool."
            self.append(_synthetic_denial(call, message))
        remaining = self.blockers(call.thread)
        if remaining:
            self.append(self.idle_event("requires_action", call.thread, remaining))
        elif call.thread == PRIMARY_THREAD:
            self.append({"type": "session.status_running"})
        else:
            self.append(self.thread_event("session.thread_status_running", call.thread))

    def thread_event(self, kind: str, thread: str, **fields: Any) -> Event:
        """A `session.thread_*` event for `thread`."""
        return {"type": kind, "session_thread_id": thread, "agent_name": self.agent_name(thread), **fields}

    def idle_event(
        self, reason: str, thread: str, event_ids: list[str] | None = None, details: Any = None
    ) -> Event:
        """A session (or thread) idle event; `requires_action` lists `event_ids` (default: the blockers)."""
        stop_reason: dict[str, Any] = {"type": reason}
        if reason == "requires_action":
            stop_reason["event_ids"] = list(event_ids) if event_ids is not None else self.blockers(thread)
        extra: dict[str, Any] = {"stop_reason": stop_reason}
        if details is not None:
            extra["stop_details"] = details
        if thread == PRIMARY_THREAD:
            return {"type": "session.status_idle", **extra}
        return self.thread_event("session.thread_status_idle", thread, **extra)


def _synthetic_denial(call: Call, message: str) -> Event:
    event: Event = {
        "type": "agent.tool_result",
        "tool_use_id": call.id,
        "is_error": True,
        "content": [{"type": "text", "text": message}],
    }
    if call.thread != PRIMARY_THREAD:
        event["session_thread_id"] = call.thread
    return event
