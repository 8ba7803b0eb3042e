"""What `stockade run` and `stockade demo` print while a session runs.

One line per handled call as it completes (or one JSON line with `--json`), a live status line on a
terminal while calls are in flight, and a summary at the end. Callbacks arrive from the runner's
thread; a lock keeps lines whole.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, TextIO

from stockade.supervisor.cli.output import call_json, call_line, field_of, to_json_line

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
        self._seen: dict[str, tuple[str, float]] = {}
        self._lock = threading.Lock()

    def on_event(self, event: object) -> None:
        """Note each call as it arrives, for the live status line."""
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
            self._seen.pop(str(call["tool_use_id"]), None)
            self._clear_status()
            self.stream.write((to_json_line(call) if self.json_lines else call_line(call)) + "\n")
            self.stream.flush()

    def error(self, message: str) -> None:
        """Print an error the run ended with."""
        with self._lock:
            self._clear_status()
            if self.json_lines:
                self.stream.write(to_json_line({"error": message}) + "\n")
            else:
                self.stream.write(f"error: {message}\n")
            self.stream.flush()

    def summary(self, ended: object) -> None:
        """Print how the run ended and what its calls did."""
        counts: dict[str, int] = {}
        for call in self.calls:
            counts[call["outcome"]] = counts.get(call["outcome"], 0) + 1
        if self.json_lines:
            line = to_json_line(
                {"summary": {"ended": _describe_end(ended), "calls": len(self.calls), **counts}}
            )
        else:
            parts = ", ".join(f"{n} {kind}" for kind, n in sorted(counts.items())) or "no calls"
            line = f"-- run ended ({_describe_end(ended)}): {len(self.calls)} calls: {parts}"
        with self._lock:
            self.stream.write(line + "\n")
            self.stream.flush()

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
                text = f"{len(self.calls)} done" + (f" | waiting: {waiting}" if waiting else "")
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
