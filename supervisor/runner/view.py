"""What the session is waiting on: a pure fold of its events (runner rules B4, B7, E1-E4, F1-F4, G, I2, L1).

`SessionView.apply(event, now)` folds one event (a JSON-shaped mapping) into the state; every query is
a pure function of the events folded so far and the `now` they were first seen at. No I/O, no clock,
no event loop: the table-driven tests feed it lists of dicts.

The fold also keeps, per thread, its open calls in order, and the calls and threads each event
changed; `take_changes()` hands those out, so the runner decides again only what an event touched
instead of every queued call.

A fresh view per connection (`fresh()`) rebuilds the state from the full history while keeping the
first-seen time of every event id, so an idle seen before a reconnect keeps its countdown (B7).
"""

from __future__ import annotations

from collections.abc import Container, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

__all__ = [
    "CALL_TYPES",
    "RESULT_ID_KEYS",
    "TERMINAL_TYPES",
    "Changes",
    "Event",
    "SessionView",
    "TrackedCall",
    "Verdict",
    "thread_of",
]

Event = Mapping[str, Any]
Verdict = Literal["allow", "deny"]

CALL_TYPES = frozenset({"agent.tool_use", "agent.custom_tool_use"})
TERMINAL_TYPES = frozenset({"session.status_terminated", "session.deleted"})
RESULT_ID_KEYS = {
    "user.tool_result": "tool_use_id",
    "agent.tool_result": "tool_use_id",
    "user.custom_tool_result": "custom_tool_use_id",
}
_PREVIEW_TYPES = frozenset({"event_start", "event_delta"})
_REQUIRES_ACTION = "requires_action"
# After `retries_exhausted` the session still accepts the results of the calls it was waiting on (F3).
_KEEPS_WAITING = "retries_exhausted"


def thread_of(event: Event | None) -> str | None:
    """The session thread of an event; `None` (or `""` on the wire) is the primary thread."""
    return (event or {}).get("session_thread_id") or None


def _stop_reason(event: Event) -> str:
    # API ISSUE: idles must carry `stop_reason`; a missing one is read as an unknown reason (not a crash).
    reason = event.get("stop_reason") or {}
    return str(reason.get("type", ""))


def _listed_ids(event: Event) -> Sequence[str]:
    return list((event.get("stop_reason") or {}).get("event_ids") or ())


@dataclass
class TrackedCall:
    """One tool call, or a placeholder for a call that later events referred to first (E4)."""

    id: str
    event: Event | None = None
    session_waits: bool | None = None
    """Whether the session waits on the call since it last ended a turn; `None` until that shows."""
    listed_at: int = 0
    """How many events had been folded when an idle last listed the call (I2)."""
    thread_stop_reason: str | None = None
    """For a subagent call: the latest idle/termination of its thread that did not list it (F4)."""
    verdict: Verdict | None = None
    """The first `user.tool_confirmation` for the call; an unknown result counts as `deny` (G2, G5)."""
    seq: int = 0
    """How many events had been folded when the call's own event was: the calls' order (I2)."""

    @property
    def name(self) -> str:
        return str((self.event or {}).get("name", ""))

    @property
    def thread(self) -> str | None:
        return thread_of(self.event)

    @property
    def permission(self) -> str | None:
        # `agent.custom_tool_use` does not declare the field; it is enforced if it ever has it.
        value = (self.event or {}).get("evaluated_permission")
        return None if value is None else str(value)

    def is_waited_on(self) -> bool:
        return self.session_waits is True and self.thread_stop_reason is None

    def is_open(self) -> bool:
        """Not denied, and waited on or not yet known to be: only these run or hold others back (I2)."""
        return not self.is_denied() and (self.session_waits is None or self.is_waited_on())

    def is_denied(self) -> bool:
        """Any deny wins: the server's evaluation or any confirmation (G3, G4)."""
        return self.event is not None and "deny" in (self.permission, self.verdict)

    def needs_confirmation(self, require_confirmation: Container[str]) -> bool:
        """`ask` or any unknown permission, or a local override, holds the call (G1; fail closed)."""
        return self.permission not in (None, "allow", "deny") or self.name in require_confirmation

    def is_unconfirmed(self, require_confirmation: Container[str]) -> bool:
        return self.verdict != "allow" and self.needs_confirmation(require_confirmation)


@dataclass
class Changes:
    """What the folds changed since the view last handed its changes out (`SessionView.take_changes`)."""

    calls: list[TrackedCall]
    """Tracked calls whose decision may differ, oldest first."""
    threads: set[str | None]
    """Threads whose FIFO queue (I2) may differ: a call of theirs changed, came or went, or their status."""


@dataclass
class SessionView:
    """The fold. `require_confirmation` names tools held for a confirmation whatever the server said."""

    require_confirmation: Container[str] = frozenset()
    seen_before: Mapping[str, float] = field(default_factory=dict)
    primary_thread_id: str | None = None
    idle_since: float | None = None
    """When the idle that ended the turn (or a later thread idle/termination) was first seen (L1)."""
    terminal_event: Event | None = None
    seen_at: dict[str, float] = field(default_factory=dict)
    calls: dict[str, TrackedCall] = field(default_factory=dict)
    _terminated: dict[str | None, bool] = field(default_factory=dict)
    # Per thread, its open calls oldest first: FIFO (I2) reads these, not every call ever tracked.
    _queues: dict[str | None, dict[str, TrackedCall]] = field(default_factory=dict)
    # What changed since `take_changes()`, so the runner decides again only what an event touched.
    _changed: dict[str, TrackedCall] = field(default_factory=dict)
    _changed_threads: set[str | None] = field(default_factory=set)
    _touched: list[TrackedCall] = field(default_factory=list)

    @property
    def ended(self) -> bool:
        return self.terminal_event is not None

    def fresh(self) -> SessionView:
        """An empty view that remembers when each event was first seen (for a new connection)."""
        return SessionView(self.require_confirmation, seen_before=self.seen_at)

    def has_seen(self, event: Event) -> bool:
        return str(event.get("id")) in self.seen_at

    def apply(self, event: Event, now: float) -> None:
        """Fold one event; duplicates (same id) and preview frames are ignored (E1)."""
        kind = str(event.get("type", ""))
        event_id = str(event.get("id"))
        if kind in _PREVIEW_TYPES or event_id in self.seen_at:
            return
        seen_at = self.seen_at[event_id] = self.seen_before.get(event_id, now)
        if kind in CALL_TYPES:
            self._apply_call(event)
        elif kind in RESULT_ID_KEYS:
            self._apply_result(str(event.get(RESULT_ID_KEYS[kind])))
        elif kind == "user.tool_confirmation":
            for call in self._calls_among([str(event.get("tool_use_id"))]):
                call.verdict = call.verdict or ("allow" if event.get("result") == "allow" else "deny")
                self._touched.append(call)
        elif kind in TERMINAL_TYPES:
            self.terminal_event = event
        elif kind == "session.status_idle":
            self._apply_session_idle(event, seen_at)
        elif kind in ("session.thread_status_running", "session.thread_status_rescheduled"):
            self._apply_thread_status(thread_of(event), terminated=False)
        elif kind in ("session.thread_status_idle", "session.thread_status_terminated"):
            self._apply_thread_status(thread_of(event), terminated=kind.endswith("terminated"))
            self._apply_thread_stop(event, seen_at)
        elif kind.startswith("session.status_"):
            self.idle_since = None
        self._requeue_touched()

    def _apply_call(self, event: Event) -> None:
        call_id = str(event.get("id"))
        # Re-inserted at the end, so the calls stay in the order of their events (I2).
        call = self.calls.pop(call_id, None) or TrackedCall(call_id)
        self.calls[call_id] = call
        call.event = event
        call.seq = len(self.seen_at)
        # A custom call runs only once an idle lists it: the server never lists one it refused (F1, F2).
        if thread_of(event) or event.get("evaluated_permission") is not None:
            call.session_waits = True
        self._touched.append(call)

    def _apply_result(self, call_id: str) -> None:
        # A denied call stays, because it is reported even when its result arrives with the denial (G7).
        call = self.calls.get(call_id)
        if call is not None and not call.is_denied():
            del self.calls[call_id]
            self._changed.pop(call_id, None)
            if call.event is not None:
                self._dequeue(call)

    def _apply_session_idle(self, event: Event, seen_at: float) -> None:
        reason = _stop_reason(event)
        if reason == _REQUIRES_ACTION:
            self.idle_since = None
            self._apply_listed(_listed_ids(event))
            return
        self.idle_since = seen_at
        for call in self.calls.values():
            waits = reason == _KEEPS_WAITING and call.session_waits is True
            if call.session_waits != waits:
                call.session_waits = waits
                self._touched.append(call)

    def _apply_thread_status(self, thread: str | None, *, terminated: bool) -> None:
        self.primary_thread_id = self.primary_thread_id or thread
        was = self._terminated.get(thread)
        self._terminated[thread] = terminated
        if was == terminated:
            return
        # A first status ends the thread's exemption from FIFO; a terminated thread's calls are hidden (G7).
        self._changed_threads.add(thread)
        if was:
            self._touched += [c for c in self.calls.values() if c.event is not None and c.thread == thread]

    def _apply_thread_stop(self, event: Event, seen_at: float) -> None:
        # A subagent's stop can make the primary thread run again, so the countdown starts over (L1).
        if self.idle_since is not None:
            self.idle_since = max(self.idle_since, seen_at)
        kind = str(event.get("type"))
        reason = _stop_reason(event) if kind == "session.thread_status_idle" else kind
        thread = thread_of(event)
        for call in self.calls.values():
            if call.event is not None and call.thread == thread and call.thread_stop_reason != reason:
                call.thread_stop_reason = reason
                self._touched.append(call)
        if reason == _REQUIRES_ACTION:
            for call in self._apply_listed(_listed_ids(event)):
                call.thread_stop_reason = None

    def _apply_listed(self, ids: Sequence[str]) -> list[TrackedCall]:
        calls = self._calls_among(ids)
        for call in calls:
            call.session_waits = True
            call.listed_at = len(self.seen_at)
        self._touched += calls
        return calls

    def _requeue_touched(self) -> None:
        """Mark the calls this event touched as changed, and move them in or out of their thread's queue."""
        for call in self._touched:
            if call.event is None:
                continue  # A placeholder is decided once its call arrives (E4).
            self._changed[call.id] = call
            if not call.is_open():
                self._dequeue(call)
                continue
            self._changed_threads.add(call.thread)
            queue = self._queues.setdefault(call.thread, {})
            if call.id not in queue:
                last = next(reversed(queue.values()), None)
                queue[call.id] = call
                if last is not None and last.seq > call.seq:
                    # Rare: a call open again (listed after an end_turn) goes back to its place.
                    self._queues[call.thread] = dict(sorted(queue.items(), key=lambda item: item[1].seq))
        self._touched.clear()

    def _dequeue(self, call: TrackedCall) -> None:
        self._changed_threads.add(call.thread)
        queue = self._queues.get(call.thread, {})
        queue.pop(call.id, None)
        if not queue:
            self._queues.pop(call.thread, None)

    def _calls_among(self, ids: Sequence[str]) -> list[TrackedCall]:
        """Tracked calls for `ids`; an id not seen yet gets a placeholder for a later call (E4)."""
        return [
            self.calls.setdefault(i, TrackedCall(i)) for i in ids if i in self.calls or i not in self.seen_at
        ]

    # Queries.

    def is_waiting_on(self, call_id: str) -> bool:
        call = self.calls.get(call_id)
        return call is not None and call.is_waited_on()

    def is_resolved(self, call_id: str) -> bool:
        """Whether the session no longer accepts a result for the call (answered, or its thread stopped)."""
        call = self.calls.get(call_id)
        return call is None or call.thread_stop_reason not in (None, _KEEPS_WAITING)

    def has_terminated(self, thread: str | None) -> bool:
        return self._terminated.get(thread, False)

    def terminated_threads(self) -> list[str | None]:
        return [thread for thread, ended in self._terminated.items() if ended]

    def tracked(self) -> Iterator[TrackedCall]:
        """Calls with an event, oldest first, skipping those of terminated threads (G7)."""
        for call in self.calls.values():
            if self._is_tracked(call):
                yield call

    def _is_tracked(self, call: TrackedCall) -> bool:
        return call.event is not None and not self.has_terminated(call.thread)

    def take_changes(self) -> Changes:
        """What changed since the last call: the tracked calls to decide again, and threads to re-queue."""
        calls = sorted(filter(self._is_tracked, self._changed.values()), key=lambda call: call.seq)
        changes = Changes(calls, self._changed_threads)
        self._changed, self._changed_threads = {}, set()
        return changes

    def queued_threads(self) -> list[str | None]:
        """The threads with open calls."""
        return list(self._queues)

    def fifo(self, thread: str | None, owned: Container[str]) -> Iterator[tuple[TrackedCall, bool]]:
        """The open calls of `thread`, oldest first, each with whether it is behind an earlier owned call
        not yet known to be runnable (I2). Only open calls run or hold others back, so none is missed."""
        # A thread that sends no status events never shows that the earlier call stopped waiting.
        exempt = thread is not None and thread not in self._terminated
        latest_listed_at = -1  # Of the unanswered calls so far.
        for call in self._queues.get(thread, {}).values():
            # An idle that lists only the later call ends the wait on the earlier one.
            yield call, not exempt and latest_listed_at >= call.listed_at
            if self._is_unanswered(call, thread, owned):
                latest_listed_at = max(latest_listed_at, call.listed_at)

    def _is_unanswered(self, call: TrackedCall, thread: str | None, owned: Container[str]) -> bool:
        if call.event is None or call.thread != thread or call.name not in owned or call.is_denied():
            return False
        return call.session_waits is None or (
            call.is_waited_on() and call.is_unconfirmed(self.require_confirmation)
        )
