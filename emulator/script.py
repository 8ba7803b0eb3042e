"""Executes a scenario's steps against a `SessionState`: history at once, live steps on a thread.

The live script starts when `SessionState.started` is set (by default: once a client that has a stream
open has finished reading the history) and runs each step in order.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from stockade.emulator.errors import ScriptFailed
from stockade.emulator.events import PRIMARY_THREAD, evaluation_for
from stockade.emulator.scenario import Step
from stockade.emulator.session import SessionState

__all__ = ["ScriptRunner", "run_step"]

log = logging.getLogger(__name__)

Event = dict[str, Any]
DEFAULT_WAIT_TIMEOUT_S = 30.0


def _with_thread(event: Event, thread: str | None) -> Event:
    if thread:
        event["session_thread_id"] = thread
    return event


def _content(value: Any) -> list[dict[str, Any]]:
    if isinstance(value, str):
        return [{"type": "text", "text": value}]
    return list(value) if value is not None else [{"type": "text", "text": "ok"}]


def _tool_use(session: SessionState, step: Step) -> None:
    permission = step.opt("permission", "allow")
    event: Event = {"type": "agent.tool_use", "name": step.value, "input": step.opt("input", {})}
    if step.opt("id"):
        event["id"] = step.opt("id")
    if permission != "none":
        event["evaluated_permission"] = permission
        evaluation = evaluation_for(permission)
        if evaluation is not None:
            event["evaluation"] = evaluation
    stored = session.append(_with_thread(event, step.opt("thread")))
    thread = step.opt("thread") or PRIMARY_THREAD
    if permission == "deny":
        denial = {"type": "agent.tool_result", "tool_use_id": stored["id"], "is_error": True}
        denial["content"] = _content(step.opt("deny_message", "Permission to use this tool was denied."))
        session.append(_with_thread(denial, step.opt("thread")))
    elif step.opt("requires_action", permission in ("ask", "none")):
        session.append(session.idle_event("requires_action", thread))


def _custom_tool_use(session: SessionState, step: Step) -> None:
    event: Event = {"type": "agent.custom_tool_use", "name": step.value, "input": step.opt("input", {})}
    if step.opt("id"):
        event["id"] = step.opt("id")
    session.append(_with_thread(event, step.opt("thread")))
    if step.opt("requires_action", True):
        session.append(session.idle_event("requires_action", step.opt("thread") or PRIMARY_THREAD))


def _idle(session: SessionState, step: Step) -> None:
    event = session.idle_event(step.value, PRIMARY_THREAD, step.opt("event_ids"), step.opt("stop_details"))
    session.append({**event, **({"id": step.opt("id")} if step.opt("id") else {})})


def _thread_idle(session: SessionState, step: Step) -> None:
    reason = step.opt("stop_reason", "end_turn")
    session.append(session.idle_event(reason, step.value, step.opt("event_ids")))


def _thread_status(kind: str) -> Callable[[SessionState, Step], None]:
    def emit(session: SessionState, step: Step) -> None:
        if "agent_name" in step.options:
            session.append(session.thread_event(kind, step.value, agent_name=step.opt("agent_name")))
        else:
            session.append(session.thread_event(kind, step.value))

    return emit


def _simple(kind: str) -> Callable[[SessionState, Step], None]:
    def emit(session: SessionState, step: Step) -> None:
        session.append({"type": kind, **({"id": step.opt("id")} if step.opt("id") else {})})

    return emit


def _confirm(session: SessionState, step: Step) -> None:
    event: Event = {
        "type": "user.tool_confirmation",
        "tool_use_id": step.value,
        "result": step.opt("result", "allow"),
    }
    if step.opt("deny_message") is not None:
        event["deny_message"] = step.opt("deny_message")
    session.from_client(event)


def _emit(session: SessionState, step: Step) -> None:
    session.append(dict(step.value))


def _message(session: SessionState, step: Step) -> None:
    event = {"type": "agent.message", "content": _content(step.value)}
    session.append(_with_thread(event, step.opt("thread")))


def _answer(session: SessionState, step: Step) -> None:
    custom = any(e["id"] == step.value and e["type"] == "agent.custom_tool_use" for e in session.events())
    key, kind = (
        ("custom_tool_use_id", "user.custom_tool_result") if custom else ("tool_use_id", "user.tool_result")
    )
    is_error = bool(step.opt("is_error", False))
    session.from_client(
        {"type": kind, key: step.value, "content": _content(step.opt("content")), "is_error": is_error}
    )


_EMITTERS: dict[str, Callable[[SessionState, Step], None]] = {
    "emit": _emit,
    "message": _message,
    "tool_use": _tool_use,
    "custom_tool_use": _custom_tool_use,
    "idle": _idle,
    "running": _simple("session.status_running"),
    "rescheduled": _simple("session.status_rescheduled"),
    "terminate": _simple("session.status_terminated"),
    "delete": _simple("session.deleted"),
    "confirm": _confirm,
    "answer": _answer,
    "thread_created": _thread_status("session.thread_created"),
    "thread_running": _thread_status("session.thread_status_running"),
    "thread_idle": _thread_idle,
    "thread_terminated": _thread_status("session.thread_status_terminated"),
    "archive": lambda s, _step: s.archive(),
    "drop_stream": lambda s, step: s.signal_streams("action", step.value),
    "fault": lambda s, step: s.faults.add(step.value),
}


def run_step(session: SessionState, step: Step) -> None:
    """Perform one event-producing step (everything but `wait` and `sleep`)."""
    _EMITTERS[step.kind](session, step)


class ScriptRunner:
    """Runs one session's live steps on a daemon thread, once the session has started."""

    def __init__(self, session: SessionState, stop: threading.Event) -> None:
        self.session = session
        self.finished = threading.Event()
        self.failure: ScriptFailed | None = None
        self._stop = stop
        self._thread = threading.Thread(target=self._run, name=f"script-{session.session_id}", daemon=True)

    def start(self) -> None:
        """Start the thread (it first waits for the session to start)."""
        self._thread.start()

    def join(self, timeout_s: float) -> None:
        """Wait for the thread to end."""
        self._thread.join(timeout_s)

    def _run(self) -> None:
        try:
            while not self.session.started.wait(0.1):
                if self._stop.is_set():
                    return
            for index, step in enumerate(self.session.scenario.steps):
                if self._stop.is_set():
                    return
                self._perform(index, step)
        except ScriptFailed as exc:
            self.failure = exc
            log.warning("script_failed session_id=%s error=%s", self.session.session_id, exc)
        finally:
            self.finished.set()

    def _perform(self, index: int, step: Step) -> None:
        if step.kind == "sleep":
            self._stop.wait(float(step.value))
        elif step.kind == "wait":
            self._wait(index, step)
        else:
            run_step(self.session, step)

    def _wait(self, index: int, step: Step) -> None:
        ids = self.session.unanswered() if step.value == "all" else [str(i) for i in step.value]
        timeout_s = float(step.opt("timeout_s", DEFAULT_WAIT_TIMEOUT_S))
        started = time.monotonic()
        done = self.session.wait_until(
            lambda: all(self.session.is_answered(i) for i in ids), timeout_s, self._stop
        )
        if not done and not self._stop.is_set() and step.opt("on_timeout", "fail") == "fail":
            missing = [i for i in ids if not self.session.is_answered(i)]
            raise ScriptFailed(f"steps[{index}]: no result for {missing} within {timeout_s}s")
        log.debug(
            "script_wait session_id=%s ids=%s done=%s waited_s=%.3f",
            self.session.session_id,
            ids,
            done,
            time.monotonic() - started,
        )
