"""What `stockade run` and `stockade demo` print while a session runs.

One line per handled call as it completes (or one JSON line with `--json`) and one per call held for
confirmation, on stdout; a live status line on stderr when it is a terminal (calls in flight, held
calls, reconnects); errors as one `stockade: error: ...` line on stderr; a summary at the end.
Callbacks arrive from the runner's thread; a lock keeps lines whole. A closed stdout (`| head`) stops
the printing, not the run.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from typing import Any, TextIO

from stockade.supervisor.cli.output import call_json, call_line, field_of, for_terminal, to_json_line

__all__ = ["CallReporter"]

STATUS_REFRESH_S = 0.2
_CALL_TYPES = ("agent.tool_use", "agent.custom_tool_use")
_CLEAR_LINE = "\r\x1b[2K"


class CallReporter:
    """Prints handled calls to `stream`; keeps the records for a summary."""

    def __init__(self, *, json_lines: bool, stream: TextIO, status: TextIO | None = None) -> None:
        self.json_lines = json_lines
        self.stream = stream
        self.status = status if status is not None and status.isatty() and not json_lines else None
        self.calls: list[dict[str, Any]] = []
        self.held: dict[str, str] = {}
        """Calls held for confirmation and not (yet) handled: tool_use_id → tool name."""
        self.reconnects = 0
        self._seen: dict[str, tuple[str, float]] = {}
        self._lock = threading.Lock()
        self._closed = False

    def on_event(self, event: object) -> None:
        """Note each call as it arrives, for the live status line."""
        with self._lock:
            self.reconnects = 0  # an event: the stream is open again
        if field_of(event, "type") in _CALL_TYPES:
            with self._lock:
                self._seen.setdefault(
                    str(field_of(event, "id")), (str(field_of(event, "name")), time.monotonic())
                )

    def on_call(self, record: object) -> None:
        """Print one handled call."""
        call = call_json(record)
        with self._lock:
            self.calls.append(call)
            self.held.pop(str(call["tool_use_id"]), None)
            self._seen.pop(str(call["tool_use_id"]), None)
            self._clear_status()
            self._write(to_json_line(call) if self.json_lines else call_line(call))

    def on_held(self, name: str, tool_use_id: str) -> None:
        """Print that a call waits for a `user.tool_confirmation` (the gate held it)."""
        with self._lock:
            if tool_use_id in self.held:
                return
            self.held[tool_use_id] = name
            self._seen.pop(tool_use_id, None)
            self._clear_status()
            if self.json_lines:
                self._write(to_json_line({"held": {"name": name, "tool_use_id": tool_use_id}}))
            else:
                self._write(f"held for confirmation: {for_terminal(name)} {for_terminal(tool_use_id)}")

    def on_reconnect(self, detail: str) -> None:
        """The stream was lost after a good connection; the runner reconnects (shown on stderr)."""
        with self._lock:
            self.reconnects += 1
            if self.status is None:
                print(
                    f"stockade: stream lost, reconnecting ({for_terminal(detail)})",
                    file=sys.stderr,
                    flush=True,
                )

    def error(self, message: str) -> None:
        """Print an error the run ended with: one `stockade: error:` line on stderr."""
        with self._lock:
            self._clear_status()
            print(f"stockade: error: {for_terminal(message)}", file=sys.stderr, flush=True)

    def _write(self, line: str) -> None:
        if self._closed:
            return
        try:
            self.stream.write(line + "\n")
            self.stream.flush()
        except BrokenPipeError:
            # The reader went away (`| head`): the run goes on, unprinted; nothing flushes to it later.
            self._closed = True
            with suppress(OSError, ValueError):
                os.dup2(os.open(os.devnull, os.O_WRONLY), self.stream.fileno())

    def summary(self, ended: object) -> None:
        """Print how the run ended and what its calls did."""
        counts: dict[str, int] = {}
        for call in self.calls:
            counts[call["outcome"]] = counts.get(call["outcome"], 0) + 1
        held = len(self.held)
        if self.json_lines:
            summary = {"ended": _describe_end(ended), "calls": len(self.calls), **counts, "held": held}
            line = to_json_line({"summary": summary})
        else:
            parts = ", ".join(f"{n} {kind}" for kind, n in sorted(counts.items())) or "no calls"
            waiting = f"; {held} held for confirmation, never confirmed" if held else ""
            line = f"-- run ended ({_describe_end(ended)}): {len(self.calls)} calls: {parts}{waiting}"
        with self._lock:
            self._write(line)

    @contextmanager
    def live_status(self) -> Iterator[None]:
        """While inside, keep a status line of in-flight calls on the terminal (if there is one)."""
        if self.status is None:
            yield
            return
        done = threading.Event()
        thread = threading.Thread(target=self._refresh, args=(done,), name="stockade-status", daemon=True)
        thread.start()
        try:
            yield
        finally:
            done.set()
            thread.join()
            with self._lock:
                self._clear_status()

    def _refresh(self, done: threading.Event) -> None:
        while not done.wait(STATUS_REFRESH_S):
            with self._lock:
                now = time.monotonic()
                waiting = ", ".join(f"{name} {now - t0:.1f}s" for name, t0 in list(self._seen.values())[:4])
                text = f"{len(self.calls)} done" + (f" | running: {waiting}" if waiting else "")
                if self.held:
                    text += f" | held for confirmation: {', '.join(list(self.held.values())[:4])}"
                if self.reconnects:
                    text += f" | reconnecting (attempt {self.reconnects})"
                text = for_terminal(text)
                assert self.status is not None
                self.status.write(_CLEAR_LINE + text[:120])
                self.status.flush()

    def _clear_status(self) -> None:
        if self.status is not None:
            self.status.write(_CLEAR_LINE)
            self.status.flush()


def _describe_end(ended: object) -> str:
    """How the run ended: the reason, and the terminal event's type if there was one."""
    reason = str(field_of(ended, "reason"))
    event = field_of(ended, "event")
    return f"{reason}: {field_of(event, 'type')}" if event else reason
